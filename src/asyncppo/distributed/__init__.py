"""Layer 2: process groups and weight sync between trainers and generators."""
