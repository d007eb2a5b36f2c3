"""OmegaConf-style `${a.b}` interpolation of a NeMo-RL config tree, resolved to plain values.

A string that is one interpolation (`${policy.model_name}`) takes the referenced value with its type (an int
stays an int, a section stays a section); interpolations inside a longer string are replaced by the value's
text (`logs/${policy.model_name}/run`). References are dotted paths from the root, list items by index
(`a.b.0`), and may chain. A reference that starts with dots is relative to the section holding the key: one dot
is that section (`${.temperature}` beside `val_temperature`), each further dot one section up (`${..model_name}`
in `policy.tokenizer.name` is `policy.model_name`). `\\${` is a literal `${`. NeMo-RL's resolvers are evaluated:
`${mul:a, b}`, `${max:a, b}`, `${add:a, b}`, `${div:a, b}` (numbers or references) and OmegaConf's
`${oc.env:NAME}` / `${oc.env:NAME, default}` (an environment variable, as text). A missing target, a reference
cycle, an unset variable and any other resolver are ConfigErrors naming the key.
"""

import os
import re
from collections.abc import Callable
from typing import Any, cast

from asyncppo.config.loading import MAX_VALUES, ConfigError

_REFERENCE = re.compile(r"(?<!\\)\$\{([^{}]*)\}")
_ESCAPED = "\\${"
ENV_RESOLVER = "oc.env"


def _divide(a: float, b: float) -> float:
    if b == 0:
        raise ZeroDivisionError
    return a / b


# The resolvers NeMo-RL registers with OmegaConf for its configs, each of two numbers.
RESOLVERS: dict[str, Callable[[float, float], float]] = {
    "mul": lambda a, b: a * b,
    "max": max,
    "add": lambda a, b: a + b,
    "div": _divide,
}


def resolve_interpolations(tree: dict[str, Any]) -> dict[str, Any]:
    """A copy of `tree` with every `${...}` replaced by the value it names."""
    resolver = _Resolver(tree)
    try:
        return cast(dict[str, Any], resolver.resolve_node(tree, "", ()))
    except RecursionError:
        raise ConfigError(["interpolation: references chain too deeply (past Python's recursion limit)"]) from None


def absolute_target(target: str, key: str) -> str:
    """The dotted path a reference names: `target` itself, or for `.x` / `..x` the path relative to the section
    holding `key` (one dot: that section; each further dot: one section up). ConfigError past the root."""
    if not target.startswith("."):
        return target
    rest = target.lstrip(".")
    dots = len(target) - len(rest)
    section = key.split(".")[:-1]
    if dots - 1 > len(section) or not rest:
        raise ConfigError([f"{key}: ${{{target}}} climbs above the config's root; expected e.g. ${{.temperature}}"])
    base = section[: len(section) - (dots - 1)]
    return ".".join([*base, rest])


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

    def _lookup(self, reference: str, key: str, stack: tuple[str, ...]) -> Any:
        reference = reference.strip()
        if ":" in reference:
            return _apply_resolver(reference, key)
        if not reference:
            raise ConfigError([f"{key}: ${{}} names no key; expected e.g. ${{policy.model_name}}"])
        target = absolute_target(reference, key)
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
                relative = "" if reference == target else f" (= {target})"
                raise ConfigError([f"{key}: ${{{reference}}}{relative} names a key the config does not have"])
        return self.resolve_node(node, target, (*stack, key))


def _apply_resolver(call: str, key: str) -> Any:
    """`mul:2, 4` -> 8: a known resolver applied to its arguments (inner references already resolved)."""
    name, _, arguments = call.partition(":")
    name = name.strip()
    if name == ENV_RESOLVER:
        return _environment_variable(arguments, call, key)
    resolver = RESOLVERS.get(name)
    if resolver is None:
        known = sorted([*RESOLVERS, ENV_RESOLVER])
        raise ConfigError([f"{key}: ${{{call}}} uses the resolver {name!r}; the port knows {known}: write the value"])
    values = [_number(part, call, key) for part in arguments.split(",")]
    if len(values) != 2:
        raise ConfigError([f"{key}: ${{{call}}}: {name} takes 2 arguments, got {len(values)}"])
    try:
        return resolver(values[0], values[1])
    except ZeroDivisionError:
        raise ConfigError([f"{key}: ${{{call}}} divides by zero"]) from None


def _environment_variable(arguments: str, call: str, key: str) -> str | None:
    """`oc.env:NAME` -> the variable's text; `oc.env:NAME, default` falls back to the default (null stays null)."""
    name, comma, default = (part.strip() for part in arguments.partition(","))
    value = os.environ.get(name)
    if value is not None:
        return value
    if comma:
        return None if default in ("null", "None", "~") else default.strip("'\"")
    raise ConfigError([f"{key}: ${{{call}}}: the environment variable {name!r} is not set; set it or write the value"])


def _number(text: str, call: str, key: str) -> float:
    # Text, not YAML: an embedded reference to 1e-08 arrives as "1e-08", which YAML 1.1 reads as a string.
    stripped = text.strip()
    for parse in (int, float):
        try:
            return parse(stripped)
        except ValueError:
            continue
    raise ConfigError([f"{key}: ${{{call}}}: {stripped!r} is not a number"])


def _join(parent: str, child: str) -> str:
    return f"{parent}.{child}" if parent else child
