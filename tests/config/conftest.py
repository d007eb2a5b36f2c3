"""A minimal valid config tree that each rule test breaks in exactly one way."""

import copy
from typing import Any

import pytest

MINIMAL_TREE: dict[str, Any] = {
    "model": {"model_name": "tiny:tiny", "train_micro_batch_size": 4},
    "value": {"train_micro_batch_size": 4},
    "data": {"train_path": "train.jsonl"},
    "ppo": {
        "num_prompts_per_step": 2,
        "num_generations_per_prompt": 4,
        "max_num_steps": 3,
        "ppo_epochs": 1,
        "adv_estimator": {
            "name": "gae",
            "gae_gamma": 1.0,
            "gae_lambda": 0.95,
            "gae_lambda_value": None,
            "gae_lambda_policy": None,
            "length_adaptive_alpha": 0.0,
            "normalize_advantages": True,
            "residual_baseline": False,
        },
    },
}


@pytest.fixture
def tree() -> dict[str, Any]:
    """A fresh deep copy of the minimal valid tree."""
    return copy.deepcopy(MINIMAL_TREE)
