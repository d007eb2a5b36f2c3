"""A reward with signal for a random tiny model (exact match of arithmetic answers is always 0 for it)."""

from collections.abc import Mapping
from typing import Any


def digit_fraction(response_text: str, row: Mapping[str, Any]) -> float:
    """Share of the response's characters that are digits: varies between samples, so advantages are non-zero."""
    return sum(char.isdigit() for char in response_text) / max(len(response_text), 1)
