"""Shared pieces of the end-to-end tests: a tiny-model run config (the session's Ray cluster is tests/conftest.py's)."""

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).parents[2]


@pytest.fixture(scope="session")
def cache_dir(shared_cache_dir: Path) -> Path:
    """The model cache of the session's runs (tiny and demo models are built once per test session)."""
    return shared_cache_dir


def _tiny_run_tree(data_dir: Path, **ppo: Any) -> dict[str, Any]:
    """A small single-turn arithmetic run on the tiny random model: seconds per step on 2 cores."""
    return {
        "model": {"model_name": "tiny:tiny", "train_micro_batch_size": 8, "max_total_sequence_length": 128},
        "value": {"train_micro_batch_size": 8, "max_total_sequence_length": 128},
        "data": {
            "train_path": str(data_dir / "train.jsonl"),
            "validation_path": str(data_dir / "validation.jsonl"),
        },
        "generation": {"max_new_tokens": 6},
        "env": {"reward_function": "partial_credit:digit_fraction"},
        "ppo": {
            "num_prompts_per_step": 4,
            "num_generations_per_prompt": 2,
            "max_num_steps": 2,
            "ppo_epochs": 1,
            "val_period": 0,
            "val_at_end": True,
            "max_val_samples": 4,
            "adv_estimator": {
                "name": "gae",
                "gae_gamma": 1.0,
                "gae_lambda": 0.95,
                "gae_lambda_value": None,
                "gae_lambda_policy": None,
                "length_adaptive_alpha": 0.0,
                "normalize_advantages": True,
                "residual_baseline": True,
            },
            **ppo,
        },
        "cluster": {"device": "cpu"},
        "checkpointing": {"save_period": 1},
        "logger": {"console": False, "tensorboard_enabled": True},
    }


@pytest.fixture(scope="session")
def data_dir() -> Path:
    return REPO / "examples" / "data" / "arithmetic"


@pytest.fixture(scope="session")
def tiny_run_tree() -> Callable[..., dict[str, Any]]:
    """Builder of a fresh tiny run config tree: tiny_run_tree(data_dir, **ppo_overrides)."""
    return _tiny_run_tree
