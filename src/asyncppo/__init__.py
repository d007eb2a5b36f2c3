"""asyncppo: PPO post-training of language models with asynchronous generation and Gym environments.

Layers (imports only go downward; tests/test_layers.py enforces it):
  0 core       types, config, algorithms, data, models
  1 adapters   generation, gym, rollout, checkpoint, metrics
  2 concurrency pipeline, distributed
  3 processes  workers
  4 entrypoints cli
"""

__version__ = "0.1.0"
