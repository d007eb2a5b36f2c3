"""Loading a run config: YAML files (with `defaults:` inheritance), dotted overrides, readable errors.

files --defaults merge--> tree --overrides (typed by the schema)--> RunConfig.model_validate
                                                                     | ValidationError
                                                                     v
                                                 ConfigError: one line per problem, full key paths
"""

import sys
from pathlib import Path
from typing import Any, TypeGuard, cast

import yaml
from pydantic import ValidationError
from pydantic_core import ErrorDetails

from asyncppo.config.base import NOTES_CONTEXT_KEY, RuleError
from asyncppo.config.schema import RunConfig
from asyncppo.config.schema_walk import UnknownKeyError, accepts_plain_string, find_field, suggest

DEFAULTS_KEY = "defaults"


class ConfigError(ValueError):
    """A config that cannot be used; `lines` holds one self-contained message per problem."""

    def __init__(self, lines: list[str]):
        super().__init__("\n".join(lines))
        self.lines = lines


def _is_tree(value: object) -> TypeGuard[dict[str, Any]]:
    """Whether `value` is a mapping of config keys (a bare isinstance leaves its key and value types unknown)."""
    return isinstance(value, dict)


def _deep_merge(base: dict[str, Any], update: dict[str, Any]) -> dict[str, Any]:
    merged = dict(base)
    for key, value in update.items():
        if _is_tree(value) and isinstance(merged.get(key), dict):
            merged[key] = _deep_merge(merged[key], value)
        else:
            merged[key] = value
    return merged


def load_yaml_tree(path: str | Path, _seen: tuple[Path, ...] = ()) -> dict[str, Any]:
    """Read a YAML config; `defaults: base.yaml` (or a list) is merged first, relative to the file, child wins."""
    path = Path(path).resolve()
    if path in _seen:
        chain = " -> ".join(str(p) for p in (*_seen, path))
        raise ConfigError([f"{path}: defaults form a cycle ({chain})"])
    if not path.is_file():
        raise ConfigError([f"{path}: config file not found"])
    try:
        tree = yaml.safe_load(path.read_text())
    except yaml.YAMLError as error:
        raise ConfigError([f"{path}: not valid YAML ({str(error).splitlines()[0]})"]) from error
    if tree is None:
        tree = dict[str, Any]()
    if not _is_tree(tree):
        raise ConfigError([f"{path}: expected a mapping of config sections, got {type(tree).__name__}"])
    parents: object = tree.pop(DEFAULTS_KEY, [])
    parents = [parents] if isinstance(parents, str) else parents
    # isinstance(parents, list) leaves the item type unknown: the items are checked as plain objects.
    if not isinstance(parents, list) or not all(isinstance(p, str) for p in cast(list[object], parents)):
        raise ConfigError([f"{path}: '{DEFAULTS_KEY}' must be a file path or a list of file paths"])
    merged: dict[str, Any] = {}
    for parent in cast(list[str], parents):  # every item was checked to be a str just above
        merged = _deep_merge(merged, load_yaml_tree(path.parent / parent, (*_seen, path)))
    return _deep_merge(merged, tree)


def parse_override(override: str) -> tuple[str, Any]:
    """`a.b=value` -> ("a.b", typed value): text for string fields, YAML scalars/lists/maps otherwise."""
    key, sep, raw = override.partition("=")
    key = key.strip()
    if not sep or not key:
        raise ConfigError([f"{override!r}: an override must look like section.key=value"])
    try:
        field = find_field(RunConfig, key)
    except UnknownKeyError as error:
        raise ConfigError([error.message]) from None
    if field.free_form and field.path != key:
        return key, yaml.safe_load(raw)
    if accepts_plain_string(field.info.annotation) and raw not in ("null", "~"):
        return key, raw
    try:
        return key, yaml.safe_load(raw)
    except yaml.YAMLError:
        raise ConfigError([f"{key}: cannot parse {raw!r} as a value"]) from None


def apply_overrides(tree: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """A copy of `tree` with each dotted override set (intermediate sections are created as needed)."""
    result = _deep_merge({}, tree)
    for override in overrides:
        key, value = parse_override(override)
        node = result
        parts = key.split(".")
        for part in parts[:-1]:
            child = node.get(part)
            if not _is_tree(child):
                child = {}
            node[part] = child = dict(child)
            node = child
        node[parts[-1]] = value
    return result


def _format_error(error: ErrorDetails) -> str:
    location = ".".join(str(part) for part in error["loc"])
    kind = error["type"]
    if kind == "extra_forbidden":
        parent, _, name = location.rpartition(".")
        hint = ""
        try:
            section = find_field(RunConfig, parent).section if parent else RunConfig
        except UnknownKeyError:
            section = None
        if section is not None:
            hint = suggest(f"{parent}." if parent else "", name, list(section.model_fields))
        return f"{location}: unknown key{hint}"
    if kind == "missing":
        return f"{location}: required key is missing"
    cause = (error.get("ctx") or {}).get("error")
    if isinstance(cause, RuleError):
        path = f"{location}.{cause.key}" if location else cause.key
        return f"{path}: {cause.message}"
    message = str(error["msg"]).removeprefix("Value error, ")
    shown = repr(error.get("input"))
    shown = shown if len(shown) <= 60 else shown[:57] + "..."
    return f"{location}: {message} (got {shown})"


def validate_tree(tree: dict[str, Any]) -> RunConfig:
    """Validate a merged config tree; raises ConfigError with one line per problem.

    Keys the rules accept but drop (a `value` section under raw_reward) are reported as `note: ...` lines on
    stderr, so an ignored setting is never silent.
    """
    notes: list[str] = []
    try:
        config = RunConfig.model_validate(tree, context={NOTES_CONTEXT_KEY: notes})
    except ValidationError as error:
        raise ConfigError([_format_error(e) for e in error.errors()]) from None
    for note in notes:
        print(f"note: {note}", file=sys.stderr)
    return config


def load_config(path: str | Path, overrides: list[str] | tuple[str, ...] = ()) -> RunConfig:
    """Load, merge, override and validate a run config."""
    return validate_tree(apply_overrides(load_yaml_tree(path), list(overrides)))


def dump_config(config: RunConfig) -> str:
    """The resolved config as YAML, every key written out (what `config show` prints and runs save)."""
    return yaml.safe_dump(config.model_dump(mode="json"), sort_keys=False, default_flow_style=False)
