"""Loading a run config: YAML files (with `defaults:` inheritance), dotted overrides, readable errors.

files --defaults merge--> tree --overrides (typed by the schema)--> RunConfig.model_validate
                                                                     | ValidationError
                                                                     v
                                                 ConfigError: one line per problem, full key paths

Files and override values are untrusted text: every way they can fail to parse (bad YAML, bytes that are not
UTF-8, nesting past the recursion limit, an integer past Python's digit limit, an alias that contains itself)
is a ConfigError naming the file or the key, never an exception from inside PyYAML or pydantic.
"""

import sys
from pathlib import Path
from typing import Any, TypeGuard, cast

import yaml
from pydantic import ValidationError
from pydantic_core import ErrorDetails
from yaml.constructor import ConstructorError

from asyncppo.config.base import NOTES_CONTEXT_KEY, RuleError
from asyncppo.config.schema import RunConfig
from asyncppo.config.schema_walk import UnknownKeyError, accepts_plain_string, find_field, suggest

DEFAULTS_KEY = "defaults"

MAX_NESTING = 32
"""Deepest nesting of mappings and lists a config may hold (the schema needs 5). Past it the merge, the
validator and the dump would recurse without bound (a YAML alias can even contain itself)."""
MAX_CONFIG_BYTES = 1024 * 1024
"""Config files above this are refused before they are read (no config is near it; a huge one hangs the parser)."""
MAX_VALUES = 100_000
"""Most values a config may hold, counting each use of a YAML alias (a few aliased lines can expand to billions)."""


class ConfigError(ValueError):
    """A config that cannot be used; `lines` holds one self-contained message per problem."""

    def __init__(self, lines: list[str]):
        super().__init__("\n".join(lines))
        self.lines = lines


def _is_tree(value: object) -> TypeGuard[dict[str, Any]]:
    """Whether `value` is a mapping of config keys (a bare isinstance leaves its key and value types unknown)."""
    return isinstance(value, dict)


def _shown(value: Any) -> str:
    """`repr(value)` cut to 60 characters, for quoting user input in a one-line message."""
    shown = repr(value)
    return shown if len(shown) <= 60 else shown[:57] + "..."


class _ConfigLoader(yaml.SafeLoader):
    """PyYAML's safe loader whose scalar constructors fail with a YAMLError that marks the offending scalar.

    The safe constructors call int(), float() and datetime() on the matched text, and those raise ValueError
    (an integer past Python's int-str digit limit, a date like 2001-13-45) or AttributeError (a malformed
    `!!timestamp`), outside PyYAML's own error type.
    """

    def construct_object(self, node: yaml.Node, deep: bool = False) -> Any:
        try:
            # PyYAML's stubs leave the constructed value untyped: config trees are checked after loading.
            return cast(Any, super().construct_object(node, deep=deep))  # pyright: ignore[reportUnknownMemberType]
        except (ValueError, AttributeError) as error:
            kind = str(node.tag).rpartition(":")[2]
            if isinstance(error, ValueError) and kind == "int":
                limit = sys.get_int_max_str_digits()
                problem = f"expected an integer of at most {limit} digits, got {_shown(node.value)}"
            else:
                reason = f" ({error})" if isinstance(error, ValueError) else ""
                problem = f"cannot read {_shown(node.value)} as {kind}{reason}"
            raise ConstructorError(None, None, problem, node.start_mark) from None

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        # PyYAML keeps the last of two equal keys without a word; in a config that hides a mistake.
        first_lines: dict[object, int] = {}
        for key_node, _ in node.value:
            key = key_node.value if isinstance(key_node, yaml.ScalarNode) else id(key_node)
            if key in first_lines:
                problem = f"duplicate key {_shown(str(key))} (first on line {first_lines[key]})"
                raise ConstructorError(None, None, problem, key_node.start_mark)
            first_lines[key] = key_node.start_mark.line + 1
        return cast(dict[Any, Any], super().construct_mapping(node, deep=deep))  # pyright: ignore[reportUnknownMemberType]


def _parse_yaml(text: str, failure: str) -> Any:
    """Parse YAML text; a ConfigError `<failure> (<what PyYAML found, and where>)` when it cannot be read."""
    try:
        return yaml.load(text, Loader=_ConfigLoader)  # a SafeLoader: builds plain data only
    except yaml.MarkedYAMLError as error:
        mark = error.problem_mark
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        reason = f"{error.problem or error.context}{where}"
    except yaml.YAMLError as error:
        reason = str(error).splitlines()[0]
    except RecursionError:
        reason = f"nested too deeply; expected at most {MAX_NESTING} levels"
    raise ConfigError([f"{failure} ({reason})"])


def check_plain_tree(value: Any, key_path: str, source: str) -> None:
    """ConfigError unless `value` nests at most MAX_NESTING levels, holds at most MAX_VALUES values and all its
    text is UTF-8 (a YAML escape or an argument byte can make a lone surrogate, which no output can print).

    `key_path` is where `value` sits in the config ('' for the root), `source` the file or override it came from.
    """
    start_depth = len(key_path.split(".")) if key_path else 0
    pending: list[tuple[Any, str, int]] = [(value, key_path, start_depth)]
    counted = 0
    while pending:
        node, path, depth = pending.pop()
        counted += 1
        if counted > MAX_VALUES:
            raise ConfigError(
                [f"{source}: holds more than {MAX_VALUES} values (YAML aliases expand); expected a config"]
            )
        at = path or source
        if isinstance(node, str) and not node.isascii() and not _is_utf8(node):
            raise ConfigError([f"{at}: {_shown(node)} is not UTF-8 text (it holds a lone surrogate)"])
        if not isinstance(node, dict | list):
            continue
        if depth >= MAX_NESTING:
            raise ConfigError([f"{_shown_path(path) or source}: nested deeper than {MAX_NESTING} levels"])
        children = (
            cast(dict[object, object], node).items() if isinstance(node, dict) else enumerate(cast(list[object], node))
        )
        for key, child in children:
            if isinstance(key, str) and not _is_utf8(key):
                raise ConfigError([f"{at}: key {_shown(key)} is not UTF-8 text (it holds a lone surrogate)"])
            pending.append((child, f"{path}.{key}" if path else str(key), depth + 1))


def _is_utf8(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _shown_path(path: str) -> str:
    return path if len(path) <= 80 else path[:77] + "..."


def _deep_merge(base: dict[str, Any], update: dict[str, Any]) -> dict[str, Any]:
    merged = dict(base)
    for key, value in update.items():
        if _is_tree(value) and isinstance(merged.get(key), dict):
            merged[key] = _deep_merge(merged[key], value)
        else:
            merged[key] = value
    return merged


def _resolve(path: str | Path) -> Path:
    try:
        return Path(path).resolve()
    except (OSError, ValueError) as error:  # ValueError: an embedded NUL, e.g. from a `defaults:` entry
        raise ConfigError([f"{str(path)!r}: not a usable file path ({error})"]) from None


def _read_utf8(path: Path) -> str:
    """The file's text; a ConfigError when it is missing, unreadable or not UTF-8 (whatever the locale says)."""
    try:
        if not path.is_file():
            raise ConfigError([f"{path}: config file not found"])
        size = path.stat().st_size
        if size > MAX_CONFIG_BYTES:
            raise ConfigError([f"{path}: config file of {size} bytes; expected at most {MAX_CONFIG_BYTES} (1 MiB)"])
        data = path.read_bytes()
    except OSError as error:
        raise ConfigError([f"{path}: cannot read the config file ({error.strerror})"]) from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as error:
        line = data.count(b"\n", 0, error.start) + 1
        byte = data[error.start : error.start + 1].hex()
        raise ConfigError(
            [f"{path}: not UTF-8 text (byte 0x{byte} on line {line}); expected a UTF-8 YAML file"]
        ) from None


def load_yaml_tree(path: str | Path, _seen: tuple[Path, ...] = ()) -> dict[str, Any]:
    """Read a YAML config; `defaults: base.yaml` (or a list) is merged first, relative to the file, child wins."""
    path = _resolve(path)
    if path in _seen:
        chain = " -> ".join(str(p) for p in (*_seen, path))
        raise ConfigError([f"{path}: defaults form a cycle ({chain})"])
    tree = _parse_yaml(_read_utf8(path), f"{path}: not valid YAML")
    check_plain_tree(tree, "", str(path))
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
    below_free_form = field.free_form and field.path != key
    if not below_free_form and accepts_plain_string(field.info.annotation) and raw not in ("null", "~"):
        value: Any = raw
    else:
        value = _parse_yaml(raw, f"{key}: cannot parse {_shown(raw)} as a YAML value")
    check_plain_tree(value, key, f"override {_shown(override)}")
    return key, value


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
