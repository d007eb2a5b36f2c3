"""Fixtures of the worker tests: one tiny model per session, worker builders, one CPU thread per test."""

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from worker_fakes import policy_settings, value_settings

from asyncppo.generation.engines import EngineSettings
from asyncppo.models.tiny import ensure_tiny
from asyncppo.workers.policy_worker import PolicyWorker
from asyncppo.workers.value_worker import ValueWorker


@pytest.fixture(autouse=True)
def _one_thread():
    """Tiny models run fastest on one thread; on shared, oversubscribed cores more threads spin-wait (100x slower)."""
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A saved TINY preset (model + tokenizer); tests must not write into it."""
    return ensure_tiny(tmp_path_factory.mktemp("model-cache"), "tiny")


@pytest.fixture
def make_policy(tiny_dir: Path) -> Callable[..., PolicyWorker]:
    """PolicyWorker on the tiny model; keyword arguments override `policy_settings` fields."""

    def build(device: str = "cpu", colocated_engine: EngineSettings | None = None, **overrides: Any) -> PolicyWorker:
        return PolicyWorker(tiny_dir, device, policy_settings(**overrides), colocated_engine)

    return build


@pytest.fixture
def make_value(tiny_dir: Path) -> Callable[..., ValueWorker]:
    """ValueWorker on the tiny model (zero head); keyword arguments override `value_settings` fields."""

    def build(device: str = "cpu", **overrides: Any) -> ValueWorker:
        return ValueWorker(tiny_dir, device, value_settings(**overrides))

    return build
