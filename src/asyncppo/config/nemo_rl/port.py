"""Porting a NeMo-RL PPO or GRPO config to an asyncppo config, with a table row for every key of the input.

    NeMo-RL YAML --defaults merged, ${...} resolved--> source tree --one rule per leaf key (table.py)--> rows
                                                                                   |
                                      asyncppo tree (the mapped values) <----------+

A leaf is a value that is not a mapping, or an empty mapping; a scheduler list is one leaf (it converts whole).
"""

import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO, cast

import yaml

from asyncppo.config.loading import ConfigError, apply_overrides, load_config, load_yaml_tree, validate_tree
from asyncppo.config.nemo_rl.algorithm_rules import FILLED_NOTE, with_algorithm_defaults
from asyncppo.config.nemo_rl.loader import load_nemo_rl_tree
from asyncppo.config.nemo_rl.rules import Action, Source
from asyncppo.config.nemo_rl.table import outcome_for
from asyncppo.config.schema import RunConfig

WHOLE_VALUE_KEYS = ("policy.scheduler", "value.scheduler")
"""Keys converted as one value even when they hold a mapping."""
TABLE_WIDTH = 100


@dataclass(frozen=True)
class PortRow:
    """One key of the NeMo-RL config and what the port did with it."""

    key: str
    action: Action
    detail: str


@dataclass(frozen=True)
class PortResult:
    """The asyncppo config tree (not yet validated) and the row of every input key, in input order."""

    tree: dict[str, Any]
    rows: list[PortRow]

    @property
    def refusals(self) -> list[str]:
        """One error line per refused key."""
        return [f"{row.key}: refused: {row.detail}" for row in self.rows if row.action == "refused"]


def is_nemo_rl_tree(tree: dict[str, Any]) -> bool:
    """A NeMo-RL config has a top-level `policy:` section; an asyncppo config has `model:` and never `policy:`."""
    return isinstance(tree.get("policy"), dict) and "model" not in tree


def port_tree(source: dict[str, Any]) -> PortResult:
    """Map a resolved NeMo-RL tree; refused keys are rows, not exceptions (the caller decides). Algorithm keys
    the tree leaves out get NeMo-RL's default first, each with a row that says so."""
    completed, filled = with_algorithm_defaults(source)
    reader = Source(completed)
    rows: list[PortRow] = []
    tree: dict[str, Any] = {}
    for key, value in _leaves(completed, ""):
        outcome = outcome_for(key, value, reader)
        # A value copied to the key of the same name says so, which keeps the table narrow and the renames visible.
        detail = "same key" if outcome.assignments == {key: value} and outcome.detail == key else outcome.detail
        if key in filled:
            detail = f"{detail} [{FILLED_NOTE} {value!r}]"
        rows.append(PortRow(key, outcome.action, detail))
        for target, assigned in outcome.assignments.items():
            _assign(tree, target, assigned)
    return PortResult(_in_schema_order(tree), rows)


def _leaves(node: dict[str, Any], prefix: str) -> list[tuple[str, Any]]:
    leaves: list[tuple[str, Any]] = []
    for name, value in node.items():
        key = f"{prefix}{name}"
        if isinstance(value, dict) and value and key not in WHOLE_VALUE_KEYS:
            leaves.extend(_leaves(cast(dict[str, Any], value), f"{key}."))
        else:
            leaves.append((key, cast(Any, value)))
    return leaves


def _assign(tree: dict[str, Any], dotted: str, value: Any) -> None:
    parts = dotted.split(".")
    node = tree
    for part in parts[:-1]:
        node = node.setdefault(part, {})
    node[parts[-1]] = value


def _in_schema_order(tree: dict[str, Any]) -> dict[str, Any]:
    order = list(RunConfig.model_fields)
    return {name: tree[name] for name in sorted(tree, key=lambda name: order.index(name) if name in order else 99)}


def port_file(path: str | Path) -> PortResult:
    """Load and port a NeMo-RL config file."""
    return port_tree(load_nemo_rl_tree(path))


def checked_tree(result: PortResult) -> dict[str, Any]:
    """The ported tree; a ConfigError listing every refused key when there are any."""
    if result.refusals:
        raise ConfigError(result.refusals)
    return result.tree


def format_table(rows: list[PortRow], width: int = TABLE_WIDTH) -> str:
    """The rows as a three-column table (key, action, target or reason); long details wrap under their column."""
    key_width = min(max((len(row.key) for row in rows), default=3), 46)
    action_width = max(len(action) for action in ("mapped", "neutral", "backend", "refused"))
    indent = key_width + action_width + 4
    lines = [f"{'key':<{key_width}}  {'action':<{action_width}}  target / reason"]
    for row in rows:
        key = row.key if len(row.key) <= key_width else row.key + "\n" + " " * key_width
        # Dotted keys are never split: a line holding a long one may pass the width rather than cut the key.
        wrapped = textwrap.wrap(row.detail, max(width - indent, 20), break_long_words=False, break_on_hyphens=False)
        wrapped = wrapped or [""]
        lines.append(f"{key:<{key_width}}  {row.action:<{action_width}}  {wrapped[0]}")
        lines.extend(" " * indent + more for more in wrapped[1:])
    return "\n".join(lines)


def dump_tree(tree: dict[str, Any]) -> str:
    """The ported asyncppo config as YAML, sections in the schema's order."""
    return yaml.safe_dump(tree, sort_keys=False, default_flow_style=False)


def load_run_config(
    path: str | Path, overrides: list[str] | tuple[str, ...] = (), table: TextIO | None = None
) -> RunConfig:
    """What `asyncppo train` loads: an asyncppo config as `load_config` does, or a NeMo-RL one (a top-level
    `policy:` and no `model:`) ported in memory, its table printed to `table` (stdout by default), then the
    overrides (asyncppo keys) applied and the result validated. Refused keys are a ConfigError."""
    if not is_nemo_rl_tree(load_yaml_tree(path)):
        return load_config(path, overrides)
    result = port_tree(load_nemo_rl_tree(path))
    print(f"{path}: a NeMo-RL config, ported:", file=table or sys.stdout)
    print(format_table(result.rows), file=table or sys.stdout, flush=True)
    return validate_tree(apply_overrides(checked_tree(result), list(overrides)))
