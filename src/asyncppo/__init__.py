"""asyncppo: PPO post-training of language models with asynchronous generation and Gym environments.

Layers (imports only go downward, and inside a layer only to a lower tier; no module import cycles;
tests/test_layers.py enforces it; docs/architecture.md states the tiers):
  0 core        types, config, algorithms, data, models, demo
  1 adapters    generation, gym, rollout, checkpoint, metrics
  2 concurrency pipeline, distributed
  3 processes   workers
  4 trainer     trainer
  5 entrypoints cli
"""

__version__ = "0.1.0"
