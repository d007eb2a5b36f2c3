"""`${...}` interpolation and loading of NeMo-RL configs: whole values keep their type, embedded ones become text,
chains, sections and relative references resolve, NeMo-RL's resolvers and `oc.env` are evaluated, a missing target,
a cycle or an unknown resolver is an error naming the key; files merge as NeMo-RL merges them (`_override_`,
OmegaConf's floats)."""

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
    message = _error({"p": {"n": 2}, "t": "${oc.select:p.n}"})
    assert message.startswith("t: ") and "resolver 'oc.select'" in message
    assert _error({"m": "x", "t": "${mul:${m}, 2}"}) == "t: ${mul:x, 2}: 'x' is not a number"
    assert _error({"t": "${mul:[1, 2}"}) == "t: ${mul:[1, 2}: '[1' is not a number"
    assert _error({"t": "${mul:1, 2, 3}"}) == "t: ${mul:1, 2, 3}: mul takes 2 arguments, got 3"
    assert _error({"t": "${div:1, 0}"}) == "t: ${div:1, 0} divides by zero"


def test_add_and_div_resolvers_and_a_float_that_arrives_as_text() -> None:
    # 1e-08 is embedded as the text "1e-08" (YAML 1.1 would read it as a string); it is still a number here.
    tree = {"age": 1, "n": "${add:${age}, 1}", "half": "${div:7, 2}", "lr": 1e-8, "twice": "${mul:${lr}, 2}"}
    resolved = resolve_interpolations(tree)
    assert (resolved["n"], resolved["half"], resolved["twice"]) == (2, 3.5, 2e-8)


def test_environment_variables_resolve_as_text_with_an_optional_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NEMO_RL_PORT_TEST_HOME", "/data/hf")
    monkeypatch.delenv("NEMO_RL_PORT_TEST_UNSET", raising=False)
    tree = {
        "path": "${oc.env:NEMO_RL_PORT_TEST_HOME}/swe1/train.jsonl",
        "fallback": "${oc.env:NEMO_RL_PORT_TEST_UNSET, /tmp/cache}",
        "none": "${oc.env:NEMO_RL_PORT_TEST_UNSET, null}",
    }
    assert resolve_interpolations(tree) == {"path": "/data/hf/swe1/train.jsonl", "fallback": "/tmp/cache", "none": None}
    assert _error({"p": "${oc.env:NEMO_RL_PORT_TEST_UNSET}"}) == (
        "p: ${oc.env:NEMO_RL_PORT_TEST_UNSET}: the environment variable 'NEMO_RL_PORT_TEST_UNSET' is not set; set it "
        "or write the value"
    )


def test_one_dot_names_a_sibling_and_each_further_dot_one_section_up() -> None:
    tree = {
        "policy": {
            "model_name": "m",
            "n": 8,
            "generation": {"temperature": 0.7, "val_temperature": "${.temperature}", "ctx": "${..n}"},
            "tokenizer": {"name": "${..model_name}", "deep": {"top": "${...n}"}},
        },
        "value": {"n": 4, "tokens": "${mul:${.n}, 2}", "label": "n=${.n}"},
    }
    resolved = resolve_interpolations(tree)
    generation = resolved["policy"]["generation"]
    assert (generation["val_temperature"], generation["ctx"]) == (0.7, 8)
    assert resolved["policy"]["tokenizer"] == {"name": "m", "deep": {"top": 8}}
    assert resolved["value"] == {"n": 4, "tokens": 8, "label": "n=4"}


def test_a_relative_reference_resolves_where_it_is_written_even_when_copied() -> None:
    # `copy` is a copy of policy.generation: its ${.temperature} still names policy.generation.temperature.
    tree = {"policy": {"generation": {"temperature": 0.5, "val": "${.temperature}"}}, "copy": "${policy.generation}"}
    assert resolve_interpolations(tree)["copy"] == {"temperature": 0.5, "val": 0.5}


def test_relative_reference_errors_name_the_key_and_the_absolute_target() -> None:
    assert _error({"a": {"b": "${.c}"}}) == "a.b: ${.c} (= a.c) names a key the config does not have"
    assert _error({"a": {"b": "${...c}"}}) == (
        "a.b: ${...c} climbs above the config's root; expected e.g. ${.temperature}"
    )
    assert "interpolation cycle" in _error({"a": {"b": "${.c}", "c": "${.b}"}})


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


def test_an_override_marker_replaces_the_parents_section_instead_of_merging(tmp_path: Path) -> None:
    (tmp_path / "parent.yaml").write_text("data: {train: {dataset_name: A, seed: 1}, shuffle: true}\nenv: {x: 1}\n")
    (tmp_path / "child.yaml").write_text(
        "defaults: parent.yaml\ndata: {_override_: true, train: {dataset_name: B}}\nenv: {y: 2}\n"
    )
    tree = load_nemo_rl_tree(tmp_path / "child.yaml")
    assert tree["data"] == {"train": {"dataset_name": "B"}}
    assert tree["env"] == {"x": 1, "y": 2}


def test_numbers_and_dates_are_read_as_omegaconf_reads_them(tmp_path: Path) -> None:
    (tmp_path / "c.yaml").write_text("a: 1e-8\nb: 3E2\nc: 2024-01-02\nd: 00:03:35:00\ne: 1.0e-6\nf: 12\n")
    tree = load_nemo_rl_tree(tmp_path / "c.yaml")
    assert tree == {"a": 1e-8, "b": 300.0, "c": "2024-01-02", "d": "00:03:35:00", "e": 1e-6, "f": 12}
    assert isinstance(tree["f"], int)


def test_an_unreadable_file_is_one_error_naming_it(tmp_path: Path) -> None:
    (tmp_path / "bad.yaml").write_text("a: [1, 2\n")
    with pytest.raises(ConfigError) as caught:
        load_nemo_rl_tree(tmp_path / "bad.yaml")
    assert caught.value.lines[0].startswith(f"{tmp_path / 'bad.yaml'}: not valid YAML (")
    with pytest.raises(ConfigError) as caught:
        load_nemo_rl_tree(tmp_path / "missing.yaml")
    assert caught.value.lines == [f"{tmp_path / 'missing.yaml'}: config file not found"]
    (tmp_path / "loop.yaml").write_text("defaults: loop.yaml\n")
    with pytest.raises(ConfigError) as caught:
        load_nemo_rl_tree(tmp_path / "loop.yaml")
    assert "defaults form a cycle" in caught.value.lines[0]
