"""Layer 4: the asyncppo command line (config, train, gym serve, report, bench)."""
