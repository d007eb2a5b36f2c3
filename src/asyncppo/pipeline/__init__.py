"""Layer 2: trajectory buffer, collector and batch sources that feed the driver."""
