"""A minimal valid config tree that each rule test breaks in exactly one way."""

import copy
from typing import Any

import pytest

from ppo_settings import gae_section

MINIMAL_TREE: dict[str, Any] = {
    "model": {"model_name": "tiny:tiny", "train_micro_batch_size": 4},
    "value": {"train_micro_batch_size": 4},
    "data": {"train_path": "train.jsonl"},
    "ppo": {
        "num_prompts_per_step": 2,
        "num_generations_per_prompt": 4,
        "max_num_steps": 3,
        "ppo_epochs": 1,
        "adv_estimator": gae_section(gae_lambda=0.95, normalize_advantages=True),
    },
}


@pytest.fixture
def tree() -> dict[str, Any]:
    """A fresh deep copy of the minimal valid tree."""
    return copy.deepcopy(MINIMAL_TREE)
