"""`${...}` interpolation of NeMo-RL configs: whole values keep their type, embedded ones become text, chains and
sections resolve, and a missing target, a cycle or a resolver is an error naming the key."""

from pathlib import Path
from typing import Any

import pytest

from asyncppo.config import ConfigError
from asyncppo.config.nemo_rl import load_nemo_rl_tree
from asyncppo.config.nemo_rl.interpolation import resolve_interpolations


def _error(tree: dict[str, Any]) -> str:
    with pytest.raises(ConfigError) as caught:
        resolve_interpolations(tree)
    return "\n".join(caught.value.lines)


def test_a_whole_value_reference_keeps_the_type() -> None:
    tree = {"policy": {"n": 512, "on": True, "none": None, "copy_n": "${policy.n}", "copy_on": "${policy.on}"}}
    tree["value"] = {"n": "${policy.n}", "none": "${policy.none}"}
    resolved = resolve_interpolations(tree)
    assert resolved["policy"]["copy_n"] == 512 and resolved["policy"]["copy_on"] is True
    assert resolved["value"] == {"n": 512, "none": None}


def test_references_chain_and_reach_sections_and_list_items() -> None:
    tree = {
        "a": {"b": "${c.d}", "items": [10, "${a.b}"]},
        "c": {"d": "${e}"},
        "e": 7,
        "whole": "${a}",
        "second": "${a.items.1}",
    }
    resolved = resolve_interpolations(tree)
    assert resolved["a"] == {"b": 7, "items": [10, 7]}
    assert resolved["whole"] == {"b": 7, "items": [10, 7]}
    assert resolved["second"] == 7


def test_references_inside_text_become_text() -> None:
    tree = {"m": "Qwen/Qwen2.5-1.5B", "n": 4, "dir": "logs/${m}/mb${n}-${missing_ok}", "missing_ok": None}
    assert resolve_interpolations(tree)["dir"] == "logs/Qwen/Qwen2.5-1.5B/mb4-null"


def test_an_escaped_reference_stays_literal() -> None:
    assert resolve_interpolations({"a": 1, "t": "cost \\${a} is ${a}"})["t"] == "cost ${a} is 1"


def test_a_missing_target_names_the_key_and_the_target() -> None:
    message = _error({"value": {"model_name": "${policy.model_nam}"}, "policy": {"model_name": "m"}})
    assert message == "value.model_name: ${policy.model_nam} names a key the config does not have"


def test_a_cycle_is_reported_with_its_chain() -> None:
    message = _error({"a": "${b}", "b": "${c}", "c": "${a}"})
    assert message == "c: interpolation cycle (a -> b -> c -> a)"


def test_a_self_reference_and_a_reference_to_its_own_section_are_cycles() -> None:
    assert "interpolation cycle" in _error({"a": "${a}"})
    assert "interpolation cycle" in _error({"a": {"b": "${a}"}})


def test_nemo_rl_resolvers_are_evaluated() -> None:
    tree = {"p": {"n": 2048, "mb": 4}, "t": "${mul:${p.n}, ${p.mb}}", "m": "${max:${p.mb}, 8}", "x": "${mul:2, 0.5}"}
    resolved = resolve_interpolations(tree)
    assert (resolved["t"], resolved["m"], resolved["x"]) == (8192, 8, 1.0)
    assert isinstance(resolved["t"], int)


def test_an_unknown_resolver_or_a_non_numeric_argument_is_an_error_naming_the_key() -> None:
    message = _error({"p": {"n": 2}, "t": "${oc.env:HOME}"})
    assert message.startswith("t: ") and "resolver 'oc.env'" in message
    assert _error({"m": "x", "t": "${mul:${m}, 2}"}) == "t: ${mul:x, 2}: 'x' is not a number"
    assert _error({"t": "${mul:[1, 2}"}) == "t: ${mul:[1, 2}: '[1' is not a number"


def test_a_section_cannot_be_embedded_in_text() -> None:
    assert "names a section" in _error({"a": {"b": 1}, "t": "x ${a}"})


def test_defaults_are_merged_relative_to_the_file_before_resolving(tmp_path: Path) -> None:
    (tmp_path / "base").mkdir()
    (tmp_path / "base" / "parent.yaml").write_text("policy: {model_name: m, max_total_sequence_length: 64}\n")
    (tmp_path / "child.yaml").write_text(
        "defaults: base/parent.yaml\npolicy: {max_total_sequence_length: 128}\n"
        "value: {n: '${policy.max_total_sequence_length}'}\n"
    )
    tree = load_nemo_rl_tree(tmp_path / "child.yaml")
    assert tree["policy"] == {"model_name": "m", "max_total_sequence_length": 128}
    assert tree["value"] == {"n": 128}


def test_references_that_expand_without_bound_are_an_error() -> None:
    tree: dict[str, Any] = {"l0": list(range(10))}
    for level in range(1, 12):
        tree[f"l{level}"] = [f"${{l{level - 1}}}"] * 10
    assert "expand the config past" in _error(tree)


def test_a_chain_past_the_recursion_limit_is_an_error() -> None:
    tree: dict[str, Any] = {f"k{i}": f"${{k{i + 1}}}" for i in range(5000)}
    tree["k5000"] = 1
    assert _error(tree) == "interpolation: references chain too deeply (past Python's recursion limit)"
