"""Shared pieces of the end-to-end tests: the session's model cache in every test's environment, a tiny-model run
config, and an in-process run to its end (the session's Ray cluster is tests/conftest.py's)."""

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from asyncppo.config import validate_tree
from asyncppo.metrics import read_metrics_jsonl
from asyncppo.trainer.build import build_run
from asyncppo.trainer.loop import train
from ppo_settings import gae_section

REPO = Path(__file__).parents[2]


@pytest.fixture(scope="session")
def cache_dir(shared_cache_dir: Path) -> Path:
    """The model cache of the session's runs (tiny and demo models are built once per test session)."""
    return shared_cache_dir


@pytest.fixture(autouse=True)
def cache_in_environment(cache_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every run of a test, in-process or a child process that inherits the environment, builds its models into
    the session's cache (so each is built once per session)."""
    monkeypatch.setenv("ASYNCPPO_CACHE_DIR", str(cache_dir))


def _train_in_process(tree: dict[str, Any], run_dir: Path) -> list[dict[str, Any]]:
    run = build_run(validate_tree(tree), run_dir)
    trained = False
    try:
        train(run)
        trained = True
    finally:
        run.close(keep_workers=trained)  # kept for the next run of this test process (tests/conftest.py)
    return read_metrics_jsonl(run_dir / "metrics.jsonl")


@pytest.fixture(scope="session")
def train_in_process(ray_cluster: None) -> Callable[[dict[str, Any], Path], list[dict[str, Any]]]:
    """Runner of a whole run in this process: train_in_process(tree, run_dir) -> the run's metrics.jsonl records.

    On the session's Ray cluster (its size: what the scale-out tests need), never one the run would start sized
    for itself: that one would stay up for the rest of the session, too small for them."""
    return _train_in_process


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
            "adv_estimator": gae_section(gae_lambda=0.95, normalize_advantages=True, residual_baseline=True),
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
