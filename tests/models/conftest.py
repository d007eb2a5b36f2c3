"""Shared fixtures for the model tests: one tiny model directory per session, built with no hub access."""

from pathlib import Path

import pytest

from asyncppo.models.tiny import ensure_tiny


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A saved TINY preset (model + tokenizer); tests must not write into it."""
    return ensure_tiny(tmp_path_factory.mktemp("model-cache"), "tiny")
