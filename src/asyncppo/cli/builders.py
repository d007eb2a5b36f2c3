"""Builders: turn the run config into the plain arguments components take (paths, numbers, dtypes)."""

import os
from pathlib import Path

from asyncppo.config import ConfigError
from asyncppo.models.tiny import PRESETS, ensure_tiny

TINY_PREFIX = "tiny:"


def cache_dir() -> Path:
    """Where locally built artifacts (tiny models) are cached: $ASYNCPPO_CACHE_DIR or ~/.cache/asyncppo."""
    return Path(os.environ.get("ASYNCPPO_CACHE_DIR", Path.home() / ".cache" / "asyncppo"))


def resolve_model_path(model_name: str, key: str = "model.model_name") -> Path:
    """A local model directory for `model_name`: `tiny:<preset>` is built (once) into the cache."""
    if model_name.startswith(TINY_PREFIX):
        preset = model_name.removeprefix(TINY_PREFIX)
        if preset not in PRESETS:
            raise ConfigError([f"{key}: unknown tiny preset {preset!r}; expected one of {sorted(PRESETS)}"])
        return ensure_tiny(cache_dir() / "models", preset)
    path = Path(model_name).expanduser()
    if not (path / "config.json").is_file():
        raise ConfigError([f"{key}: {model_name!r} is not a local Hugging Face model directory (no config.json)"])
    return path
