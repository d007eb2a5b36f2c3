"""Reading a NeMo-RL config file the way NeMo-RL's loader does, before the port maps it (port.py calls it).

    file --YAML, OmegaConf's scalars--> tree --`defaults:` merged, parents first--> merged tree
         --`${...}` resolved (interpolation.py)--> source tree

NeMo-RL loads YAML through OmegaConf, which reads `1e-8` as a number (YAML 1.1 wants a dot: `1.0e-8`) and keeps
dates as text, merges each file over the files its `defaults:` names (a path or a list, relative to the file;
mappings merge key by key, anything else is replaced), and lets a top-level section that says `_override_: true`
replace the parent's section instead of merging into it. This module does the same; asyncppo's own loader
(loading.py) keeps strict YAML 1.1 and has no `_override_`.
"""

import re
from pathlib import Path
from typing import Any, cast

import yaml

from asyncppo.config.loading import DEFAULTS_KEY, ConfigError, check_plain_tree
from asyncppo.config.nemo_rl.interpolation import resolve_interpolations

OVERRIDE_MARKER = "_override_"
_FLOAT_TAG = "tag:yaml.org,2002:float"
_TIMESTAMP_TAG = "tag:yaml.org,2002:timestamp"
# YAML 1.1's floats, plus an exponent without a dot (`1e-8`, `5E3`), as OmegaConf reads them.
_FLOAT = re.compile(
    r"""^(?:[-+]?(?:[0-9][0-9_]*)\.[0-9_]*(?:[eE][-+]?[0-9]+)?
    |[-+]?(?:[0-9][0-9_]*)[eE][-+]?[0-9]+
    |\.[0-9_]+(?:[eE][-+][0-9]+)?
    |[-+]?[0-9][0-9_]*(?::[0-5]?[0-9])+\.[0-9_]*
    |[-+]?\.(?:inf|Inf|INF)
    |\.(?:nan|NaN|NAN))$""",
    re.VERBOSE,
)


class _OmegaConfLoader(yaml.SafeLoader):
    """A safe loader (plain data only) with OmegaConf's scalar rules: its floats, and dates left as text."""


_OmegaConfLoader.yaml_implicit_resolvers = {
    first: [(tag, pattern) for tag, pattern in rules if tag not in (_FLOAT_TAG, _TIMESTAMP_TAG)]
    for first, rules in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
# PyYAML's stubs leave the resolver registry untyped.
_OmegaConfLoader.add_implicit_resolver(_FLOAT_TAG, _FLOAT, list("-+0123456789."))  # pyright: ignore[reportUnknownMemberType]


def load_nemo_rl_tree(path: str | Path) -> dict[str, Any]:
    """Read a NeMo-RL config: `defaults:` merged (relative to the file, child wins), then `${...}` resolved."""
    return resolve_interpolations(merged_tree(Path(path), ()))


def merged_tree(path: Path, seen: tuple[Path, ...]) -> dict[str, Any]:
    """The file's tree over its parents' trees (no interpolation yet)."""
    resolved = _resolved_path(path)
    if resolved in seen:
        chain = " -> ".join(str(p) for p in (*seen, resolved))
        raise ConfigError([f"{resolved}: defaults form a cycle ({chain})"])
    tree = _read_tree(resolved)
    parents: Any = tree.pop(DEFAULTS_KEY, [])
    parents = [parents] if isinstance(parents, str) else parents
    if not isinstance(parents, list) or not all(isinstance(p, str) for p in cast(list[Any], parents)):
        raise ConfigError([f"{resolved}: '{DEFAULTS_KEY}' must be a file path or a list of file paths"])
    merged: dict[str, Any] = {}
    for parent in cast(list[str], parents):
        merged = merge_over(merged, merged_tree(resolved.parent / parent, (*seen, resolved)))
    return merge_over(merged, tree)


def merge_over(base: dict[str, Any], child: dict[str, Any]) -> dict[str, Any]:
    """`child` merged over `base`; a top-level child section with `_override_: true` replaces base's section."""
    kept = dict(base)
    cleaned: dict[str, Any] = {}
    for name, section in child.items():
        if isinstance(section, dict) and cast(dict[str, Any], section).get(OVERRIDE_MARKER) is True:
            kept.pop(name, None)
            section = {key: value for key, value in cast(dict[str, Any], section).items() if key != OVERRIDE_MARKER}
        cleaned[name] = section
    return _deep_merge(kept, cleaned)


def _deep_merge(base: dict[str, Any], child: dict[str, Any]) -> dict[str, Any]:
    merged = dict(base)
    for name, value in child.items():
        below = merged.get(name)
        if isinstance(value, dict) and isinstance(below, dict):
            merged[name] = _deep_merge(cast(dict[str, Any], below), cast(dict[str, Any], value))
        else:
            merged[name] = value
    return merged


def _resolved_path(path: Path) -> Path:
    try:
        return path.resolve()
    except (OSError, ValueError) as error:  # ValueError: an embedded NUL, e.g. from a `defaults:` entry
        raise ConfigError([f"{str(path)!r}: not a usable file path ({error})"]) from None


def _read_tree(path: Path) -> dict[str, Any]:
    try:
        if not path.is_file():
            raise ConfigError([f"{path}: config file not found"])
        text = path.read_bytes().decode("utf-8")
    except OSError as error:
        raise ConfigError([f"{path}: cannot read the config file ({error.strerror})"]) from None
    except UnicodeDecodeError as error:
        raise ConfigError([f"{path}: not UTF-8 text ({error.reason} at byte {error.start})"]) from None
    try:
        tree: Any = yaml.load(text, Loader=_OmegaConfLoader)  # a SafeLoader: builds plain data only
    except yaml.MarkedYAMLError as error:
        mark = error.problem_mark
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        raise ConfigError([f"{path}: not valid YAML ({error.problem or error.context}{where})"]) from None
    # A scalar constructor may fail outside PyYAML's error type (an int past Python's digit limit: ValueError).
    except (yaml.YAMLError, ValueError, AttributeError, RecursionError) as error:
        raise ConfigError([f"{path}: not valid YAML ({type(error).__name__}: {error})"]) from None
    check_plain_tree(tree, "", str(path))
    if tree is None:
        return {}
    if not isinstance(tree, dict):
        raise ConfigError([f"{path}: expected a mapping of config sections, got {type(tree).__name__}"])
    return cast(dict[str, Any], tree)
