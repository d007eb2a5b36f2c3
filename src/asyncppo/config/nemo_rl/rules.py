"""The building blocks of the key mapping: what happens to one NeMo-RL key, and the small rule constructors.

Every key of a ported config gets one `Outcome`: `mapped` (its value, converted where the shapes differ, goes to
the asyncppo keys in `assignments`), `neutral` (dropped: the value is what asyncppo does anyway), `backend`
(dropped: it configures machinery asyncppo replaces; the detail names the asyncppo key that takes its role) or
`refused` (asyncppo cannot express it; the detail says why). The table itself is in `table.py`.
"""

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal, cast

Action = Literal["mapped", "neutral", "backend", "refused"]


@dataclass(frozen=True)
class Outcome:
    """What the port does with one key: the action, the target or reason shown in the table, the values set."""

    action: Action
    detail: str
    assignments: dict[str, Any] = field(default_factory=dict[str, Any])


class Source:
    """The resolved NeMo-RL tree, read by dotted key (rules that look at sibling keys use it)."""

    def __init__(self, tree: dict[str, Any]):
        self.tree = tree

    def get(self, key: str, default: Any = None) -> Any:
        """The value at dotted `key`, or `default` when any part of the path is missing."""
        node: Any = self.tree
        for part in key.split("."):
            if not isinstance(node, dict) or part not in node:
                return default
            node = cast(dict[str, Any], node)[part]
        return node

    def enabled(self, key: str) -> bool:
        """Whether the section at `key` has `enabled: true`."""
        return self.get(f"{key}.enabled") is True


Rule = Callable[[str, Any, Source], Outcome]
"""(source key, its value, the whole source) -> what happens to the key."""


def mapped(target: str, value: Any, note: str = "") -> Outcome:
    """The value goes to `target`; `note` explains a conversion."""
    return Outcome("mapped", f"{target}{f' ({note})' if note else ''}", {target: value})


def same_as(target: str) -> Rule:
    """Copy the value to `target` unchanged."""
    return lambda _key, value, _source: mapped(target, value)


def backend(reason: str) -> Rule:
    """Drop the key: it configures a backend asyncppo replaces; `reason` names the asyncppo key in its role."""
    return lambda _key, _value, _source: Outcome("backend", reason)


def neutral_when(expected: tuple[Any, ...], reason: str, refusal: str) -> Rule:
    """Drop the key when its value is one of `expected` (asyncppo's behaviour), else refuse it with `refusal`."""

    def rule(_key: str, value: Any, _source: Source) -> Outcome:
        # `True == 1` in Python: a bool only matches a bool, so `enabled: 1` is not taken for `enabled: true`.
        if any(value == c and isinstance(value, bool) == isinstance(c, bool) for c in expected):
            return Outcome("neutral", reason)
        return Outcome("refused", f"{value!r}: {refusal}")

    return rule


def refuse(reason: str) -> Rule:
    """Refuse the key whatever its value."""
    return lambda _key, value, _source: Outcome("refused", f"{value!r}: {reason}")
