"""OmegaConf-style `${a.b}` interpolation of a NeMo-RL config tree, resolved to plain values.

A string that is one interpolation (`${policy.model_name}`) takes the referenced value with its type (an int
stays an int, a section stays a section); interpolations inside a longer string are replaced by the value's
text (`logs/${policy.model_name}/run`). References are absolute dotted paths from the root, list items by index
(`a.b.0`), and may chain. `\\${` is a literal `${`. NeMo-RL's own resolvers `${mul:a, b}` and `${max:a, b}`
(numbers or references) are evaluated. A missing target, a reference cycle and any other resolver are
ConfigErrors naming the key.
"""

import math
import re
from collections.abc import Callable
from typing import Any, cast

import yaml

from asyncppo.config.loading import MAX_VALUES, ConfigError

_REFERENCE = re.compile(r"(?<!\\)\$\{([^{}]*)\}")
_ESCAPED = "\\${"
# The resolvers NeMo-RL registers with OmegaConf for its configs (products and maxima of sizes).
RESOLVERS: dict[str, Callable[[list[float]], float]] = {"mul": math.prod, "max": max}


def resolve_interpolations(tree: dict[str, Any]) -> dict[str, Any]:
    """A copy of `tree` with every `${...}` replaced by the value it names."""
    resolver = _Resolver(tree)
    try:
        return cast(dict[str, Any], resolver.resolve_node(tree, "", ()))
    except RecursionError:
        raise ConfigError(["interpolation: references chain too deeply (past Python's recursion limit)"]) from None


class _Resolver:
    """Resolves references against one root; `stack` holds the keys being resolved, to report cycles."""

    def __init__(self, root: dict[str, Any]):
        self.root = root
        self.visited = 0

    def resolve_node(self, node: Any, key: str, stack: tuple[str, ...]) -> Any:
        # References to sections copy them: a few lines can expand to billions of values, as YAML aliases can.
        self.visited += 1
        if self.visited > MAX_VALUES:
            raise ConfigError([f"{key}: references expand the config past {MAX_VALUES} values; expected a config"])
        if isinstance(node, dict):
            items = cast(dict[str, Any], node).items()
            return {name: self.resolve_node(child, _join(key, str(name)), stack) for name, child in items}
        if isinstance(node, list):
            return [
                self.resolve_node(child, _join(key, str(i)), stack) for i, child in enumerate(cast(list[Any], node))
            ]
        if isinstance(node, str):
            return self._resolve_string(node, key, stack)
        return node

    def _resolve_string(self, text: str, key: str, stack: tuple[str, ...]) -> Any:
        whole = _REFERENCE.fullmatch(text)
        if whole is not None:
            return self._lookup(whole.group(1), key, stack)

        def embed(match: re.Match[str]) -> str:
            value = self._lookup(match.group(1), key, stack)
            if isinstance(value, dict | list):
                raise ConfigError([f"{key}: ${{{match.group(1)}}} names a section, which cannot be embedded in text"])
            return "null" if value is None else str(value)

        replaced = _REFERENCE.sub(embed, text)
        if _REFERENCE.search(replaced):  # an outer `${...}` around inner ones, e.g. a resolver's arguments
            return self._resolve_string(replaced, key, stack)
        return replaced.replace(_ESCAPED, "${")

    def _lookup(self, target: str, key: str, stack: tuple[str, ...]) -> Any:
        target = target.strip()
        if ":" in target:
            return _apply_resolver(target, key)
        if not target or target.startswith("."):
            raise ConfigError(
                [f"{key}: ${{{target}}} is not an absolute dotted key; expected e.g. ${{policy.model_name}}"]
            )
        # A target that is a key being resolved, or a section holding one, would be resolved forever.
        if any(held == target or held.startswith(f"{target}.") for held in (*stack, key)):
            chain = " -> ".join((*stack, key, target))
            raise ConfigError([f"{key}: interpolation cycle ({chain})"])
        node: Any = self.root
        for part in target.split("."):
            if isinstance(node, dict) and part in node:
                node = cast(dict[str, Any], node)[part]
            elif isinstance(node, list) and part.isdigit() and int(part) < len(cast(list[Any], node)):
                node = cast(list[Any], node)[int(part)]
            else:
                raise ConfigError([f"{key}: ${{{target}}} names a key the config does not have"])
        return self.resolve_node(node, target, (*stack, key))


def _apply_resolver(call: str, key: str) -> Any:
    """`mul:2, 4` -> 8: a known resolver applied to its numeric arguments (inner references already resolved)."""
    name, _, arguments = call.partition(":")
    resolver = RESOLVERS.get(name.strip())
    if resolver is None:
        raise ConfigError(
            [
                f"{key}: ${{{call}}} uses the resolver {name.strip()!r}; the port knows {sorted(RESOLVERS)}: "
                "write the value"
            ]
        )
    values = [_number(part, call, key) for part in arguments.split(",")]
    return resolver(values)


def _number(text: str, call: str, key: str) -> float:
    try:
        value: Any = yaml.safe_load(text) if text.strip() else None
    except yaml.YAMLError:
        value = None  # not a YAML scalar, so not a number: reported below
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ConfigError([f"{key}: ${{{call}}}: {text.strip()!r} is not a number"])
    return value


def _join(parent: str, child: str) -> str:
    return f"{parent}.{child}" if parent else child
