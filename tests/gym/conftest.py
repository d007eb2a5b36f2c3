"""Shared fixtures for the gym tests: the tiny model directory and tokenizer, one intra-op thread per test."""

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from transformers import PreTrainedTokenizerBase

from asyncppo.models.tiny import ensure_tiny
from asyncppo.models.tokenizer import load_tokenizer


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A saved TINY preset (model + tokenizer); tests must not write into it."""
    return ensure_tiny(tmp_path_factory.mktemp("model-cache"), "tiny")


@pytest.fixture(scope="session")
def tokenizer(tiny_dir: Path) -> PreTrainedTokenizerBase:
    return load_tokenizer(tiny_dir)


@pytest.fixture(autouse=True)
def one_intra_op_thread() -> Iterator[None]:
    """One torch thread, then restore it (see tests/generation/conftest.py: small ops stall on a busy 2-core box)."""
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)
