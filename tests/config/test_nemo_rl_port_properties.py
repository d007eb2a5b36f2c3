"""Properties of the port over random parts of the mirrored NeMo-RL configs: a config made of any subset of a
mirror's keys ports without an exception, and every value the port writes (a `mapped` row's) is one its asyncppo
key accepts, so `mapped` never leads to a type or range error at validation. Cross-key rules (async needs
importance sampling, ...) are the whole config's business: every mirror that ports whole validates whole
(test_nemo_rl_fixtures.py)."""

import functools
from pathlib import Path
from typing import Annotated, Any, cast

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import TypeAdapter, ValidationError

from asyncppo.config.nemo_rl import load_nemo_rl_tree, port_tree
from asyncppo.config.schema import RunConfig
from asyncppo.config.schema_walk import find_field

MIRRORS = sorted((Path(__file__).parents[1] / "data" / "nemo_rl" / "examples").rglob("*.yaml"))
WHOLE_VALUES = ("policy.scheduler", "value.scheduler")
"""Keys the port reads as one value though they may hold a mapping (as port.py does)."""


def _leaves(node: dict[str, Any], prefix: str = "") -> list[tuple[str, Any]]:
    leaves: list[tuple[str, Any]] = []
    for name, value in node.items():
        key = f"{prefix}{name}"
        if isinstance(value, dict) and value and key not in WHOLE_VALUES:
            leaves.extend(_leaves(cast(dict[str, Any], value), f"{key}."))
        else:
            leaves.append((key, value))
    return leaves


def _tree(leaves: list[tuple[str, Any]]) -> dict[str, Any]:
    tree: dict[str, Any] = {}
    for key, value in leaves:
        *parents, last = key.split(".")
        node = tree
        for part in parents:
            node = node.setdefault(part, {})
        node[last] = value
    return tree


def _invalid_values(node: dict[str, Any], prefix: str = "") -> list[str]:
    """`key: error` for every value of an asyncppo tree that its field does not accept (one field at a time)."""
    problems: list[str] = []
    for name, value in node.items():
        key = f"{prefix}{name}"
        field = find_field(RunConfig, key)
        if field.section is not None and not field.free_form and isinstance(value, dict):
            problems.extend(_invalid_values(cast(dict[str, Any], value), f"{key}."))
            continue
        try:
            _adapter(key).validate_python(value)
        except ValidationError as error:
            problems.append(f"{key}: {value!r}: {error.errors()[0]['msg']}")
    return problems


@functools.cache
def _adapter(key: str) -> TypeAdapter[Any]:
    """A validator of asyncppo's field `key` alone: its type with its constraints (ranges, lengths)."""
    info = find_field(RunConfig, key).info
    annotation: Any = Annotated[info.annotation, *info.metadata] if info.metadata else info.annotation
    return TypeAdapter(annotation)


# The mirrors, loaded once (the HF_HOME a recipe's ${oc.env:...} reads is set for the whole module).
_SOURCES: dict[str, dict[str, Any]] = {}


@pytest.fixture(scope="module", autouse=True)
def loaded_mirrors() -> None:
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("HF_HOME", "/data/hf")
        for path in MIRRORS:
            _SOURCES[path.name] = load_nemo_rl_tree(path)


@st.composite
def _mirror_parts(draw: st.DrawFn) -> tuple[str, dict[str, Any]]:
    name = draw(st.sampled_from([path.name for path in MIRRORS]))
    leaves = _leaves(_SOURCES[name])
    kept = draw(st.lists(st.booleans(), min_size=len(leaves), max_size=len(leaves)))
    return name, _tree([leaf for leaf, keep in zip(leaves, kept, strict=True) if keep])


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(_mirror_parts())
def test_any_part_of_a_mirror_ports_and_every_mapped_value_is_one_its_key_accepts(
    part: tuple[str, dict[str, Any]],
) -> None:
    name, source = part
    result = port_tree(source)  # no exception, whatever siblings a rule finds missing
    assert _invalid_values(result.tree) == [], name
    refused = {row.key for row in result.rows if row.action == "refused"}
    assert refused == {line.split(": refused: ")[0] for line in result.refusals}


@pytest.mark.parametrize("path", MIRRORS, ids=lambda path: path.name)
def test_every_value_a_whole_mirror_maps_is_one_its_key_accepts(path: Path) -> None:
    assert _invalid_values(port_tree(_SOURCES[path.name]).tree) == []


def test_the_value_check_catches_a_mapped_null_where_an_integer_is_expected() -> None:
    # What the port once did with NeMo-RL's `logprob_chunk_size: null`: the check must see it.
    assert _invalid_values({"model": {"logprob_chunk_size": None}}) == [
        "model.logprob_chunk_size: None: Input should be a valid integer"
    ]
