"""asyncppo: PPO post-training of language models with asynchronous generation and Gym environments.

    import asyncppo
    config = asyncppo.load_config("run.yaml", overrides={"ppo.max_num_steps": 2})
    result = asyncppo.train(config, run_dir="runs/try")

The Python API (`load_config`, `check`, `train`, their `ConfigError`) lives in api.py and is loaded on first use,
so `import asyncppo` imports nothing else; torch, transformers and Ray load only when `train` starts a run.

Layers (imports only go downward, and inside a layer only to a lower tier; no module import cycles;
tests/test_layers.py enforces it; docs/architecture.md states the tiers):
  0 core        types, config, algorithms, data, models, demo
  1 adapters    generation, gym, rollout, checkpoint, metrics
  2 concurrency pipeline, distributed
  3 processes   workers
  4 trainer     trainer
  5 entrypoints api, then cli (which calls it)
"""

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # what `__getattr__` hands out, for type checkers and editors
    from asyncppo.api import CheckedRun, ConfigError, RunConfig, TrainResult, check, load_config, train

__version__ = "0.1.0"
__all__ = ["CheckedRun", "ConfigError", "RunConfig", "TrainResult", "check", "load_config", "train"]


def __getattr__(name: str) -> object:
    """The API's names, imported from api.py when first asked for (PEP 562)."""
    if name in __all__:
        return getattr(importlib.import_module("asyncppo.api"), name)
    raise AttributeError(f"module 'asyncppo' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
