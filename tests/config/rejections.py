"""The one error line a config tree is rejected with, for the rule tests (each breaks a valid tree in one way)."""

from typing import Any

import pytest

from asyncppo.config import ConfigError, validate_tree


def rejected(tree: dict[str, Any]) -> str:
    """Validate `tree`, which must fail with exactly one error line; return that line."""
    with pytest.raises(ConfigError) as caught:
        validate_tree(tree)
    assert len(caught.value.lines) == 1, caught.value.lines
    return caught.value.lines[0]
