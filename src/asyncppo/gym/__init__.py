"""Layer 1: the NeMo-Gym HTTP protocol: policy server, gym client and built-in environment servers."""
