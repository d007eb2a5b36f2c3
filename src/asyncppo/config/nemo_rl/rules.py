"""The building blocks of the key mapping: what happens to one NeMo-RL key, and the small rule constructors.

Every key of a ported config gets one `Outcome`: `mapped` (its value, converted where the shapes differ, goes to
the asyncppo keys in `assignments`), `neutral` (dropped: the value is what asyncppo does anyway, or configures a
feature that is off), `backend` (dropped: it configures machinery asyncppo replaces; the detail names the
asyncppo key that takes its role) or `refused` (asyncppo cannot express it; the detail names the feature). The
rules themselves are in the `*_rules.py` modules, gathered by `table.py`.
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

    def has(self, key: str) -> bool:
        """Whether dotted `key` is present (with any value, null included)."""
        missing = object()
        return self.get(key, missing) is not missing

    def enabled(self, key: str) -> bool:
        """Whether the section at `key` has `enabled: true`."""
        return self.get(f"{key}.enabled") is True


def algorithm_section(source: Source) -> str:
    """The algorithm section of a NeMo-RL tree: `grpo` for a GRPO config, else `ppo`."""
    return "grpo" if source.has("grpo") and not source.has("ppo") else "ppo"


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


def neutral(reason: str) -> Rule:
    """Drop the key whatever its value: `reason` says why the value cannot change what asyncppo does."""
    return lambda _key, _value, _source: Outcome("neutral", reason)


def is_one_of(value: Any, expected: tuple[Any, ...]) -> bool:
    """`value in expected`, but a bool only matches a bool (`True == 1` in Python, so `enabled: 1` is no `true`)."""
    return any(value == c and isinstance(value, bool) == isinstance(c, bool) for c in expected)


def neutral_when(expected: tuple[Any, ...], reason: str, refusal: str) -> Rule:
    """Drop the key when its value is one of `expected` (asyncppo's behaviour), else refuse it with `refusal`."""

    def rule(_key: str, value: Any, _source: Source) -> Outcome:
        if is_one_of(value, expected):
            return Outcome("neutral", reason)
        return Outcome("refused", f"{value!r}: {refusal}")

    return rule


def refuse(reason: str) -> Rule:
    """Refuse the key whatever its value."""
    return lambda _key, value, _source: Outcome("refused", f"{value!r}: {reason}")


def lacks(feature: str) -> str:
    """The refusal text of a feature asyncppo does not have."""
    return f"asyncppo has no {feature}"


def feature_switch(feature: str, off: tuple[Any, ...] = (False, None)) -> Rule:
    """The on/off key of a feature asyncppo lacks: off values are neutral, anything else is refused naming it."""
    return neutral_when(off, f"off: no {feature}, as asyncppo runs", lacks(feature))


def feature_settings(switch_key: str, feature: str) -> Rule:
    """A setting of a switchable feature (`switch_key` relative to the setting's section, e.g. `enabled`): it does
    nothing while the feature is off; while on, the switch's row refuses the feature."""

    def rule(key: str, _value: Any, source: Source) -> Outcome:
        section = key.rpartition(".")[0]
        while section and not source.has(f"{section}.{switch_key}"):
            section = section.rpartition(".")[0]
        switch = f"{section}.{switch_key}" if section else switch_key
        if source.get(switch) in (False, None):
            return Outcome("neutral", f"{feature} is off ({switch}: {source.get(switch)!r})")
        return Outcome("backend", f"a setting of {feature}, refused at {switch}")

    return rule
