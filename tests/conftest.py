"""Fixtures shared by every test folder: one tiny model directory per session, one intra-op thread per test."""

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from asyncppo.models.tiny import ensure_tiny


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A saved TINY preset (model + tokenizer); tests must not write into it."""
    return ensure_tiny(tmp_path_factory.mktemp("model-cache"), "tiny")


@pytest.fixture(autouse=True)
def one_intra_op_thread() -> Iterator[None]:
    """Run torch ops on one thread, then restore the setting (it is process-wide, engine threads included).

    The tiny model's matmuls are too small to gain from a second thread, and on a busy 2-core machine each
    two-thread OpenMP region can stall for a scheduler slice (measured: 38 small linears 0.7 ms vs 600 ms).
    """
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)
