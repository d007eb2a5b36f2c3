"""Config files and override values as untrusted text: every way they fail to parse is one ConfigError line
naming the file or the key, never an exception from inside PyYAML or pydantic."""

from pathlib import Path

import pytest
import yaml

from asyncppo.config import ConfigError, load_config, loading
from asyncppo.config.loading import apply_overrides, load_yaml_tree

DEMO = Path(__file__).parents[2] / "examples" / "configs" / "demo.yaml"


def _override_error(tree, override: str) -> str:
    with pytest.raises(ConfigError) as caught:
        apply_overrides(tree, [override])
    assert len(caught.value.lines) == 1, caught.value.lines
    return caught.value.lines[0]


def _file_error(path: Path) -> str:
    with pytest.raises(ConfigError) as caught:
        load_yaml_tree(path)
    assert len(caught.value.lines) == 1, caught.value.lines
    return caught.value.lines[0]


def test_bad_yaml_below_a_free_form_key_names_the_key_and_the_value(tree):
    # env.gym.agent_urls is a dict: keys below it are parsed as YAML, and '[' opens a list that never closes.
    assert _override_error(tree, "env.gym.agent_urls.foo=[") == (
        "env.gym.agent_urls.foo: cannot parse '[' as a YAML value "
        "(expected the node content, but found '<stream end>' at line 1, column 2)"
    )


def test_an_override_nested_past_the_recursion_limit_is_refused(tree):
    line = _override_error(tree, "ppo.ppo_epochs=" + "[" * 1200)
    assert line.startswith("ppo.ppo_epochs: cannot parse '[[[")
    assert line.endswith(f"(nested too deeply; expected at most {loading.MAX_NESTING} levels)")


def test_an_override_nested_deeper_than_the_cap_names_its_key(tree):
    # 40 levels parse fine in PyYAML, but no config key needs more than loading.MAX_NESTING.
    line = _override_error(tree, "generation.stop_token_ids=" + "[" * 40 + "]" * 40)
    assert line.startswith("generation.stop_token_ids.0.0.")
    assert line.endswith(f": nested deeper than {loading.MAX_NESTING} levels")


def test_an_integer_past_the_digit_limit_is_refused(tree):
    line = _override_error(tree, "ppo.ppo_epochs=" + "9" * 4400)
    assert line.startswith("ppo.ppo_epochs: cannot parse '999")
    assert "(expected an integer of at most 4300 digits, got '999" in line


def test_a_malformed_tagged_scalar_is_refused(tree):
    assert _override_error(tree, "env.gym.agent_urls.foo=!!timestamp x") == (
        "env.gym.agent_urls.foo: cannot parse '!!timestamp x' as a YAML value "
        "(cannot read 'x' as timestamp at line 1, column 1)"
    )


def test_text_with_a_lone_surrogate_is_refused(tree):
    # A non-UTF-8 byte in a command-line argument reaches Python as a lone surrogate (surrogateescape).
    assert _override_error(tree, "model.model_name=a\udcffb") == (
        "model.model_name: 'a\\udcffb' is not UTF-8 text (it holds a lone surrogate)"
    )


def test_a_file_that_is_not_utf8_names_the_byte_and_the_line(tmp_path):
    config = tmp_path / "f.yaml"
    config.write_bytes(b"ppo:\n  ppo_epochs: \xff\n")
    assert _file_error(config) == f"{config}: not UTF-8 text (byte 0xff on line 2); expected a UTF-8 YAML file"


def test_bad_yaml_in_a_file_names_the_line(tmp_path):
    config = tmp_path / "f.yaml"
    config.write_text("ppo:\n  ppo_epochs: [1\n")
    assert _file_error(config).startswith(f"{config}: not valid YAML (expected ',' or ']', but got '<stream end>'")


def test_an_alias_that_contains_itself_is_refused(tmp_path):
    config = tmp_path / "f.yaml"
    config.write_text("env:\n  gym:\n    agent_urls: &loop {a: *loop}\n")
    assert _file_error(config).endswith(f": nested deeper than {loading.MAX_NESTING} levels")


def test_aliases_that_expand_past_the_value_cap_are_refused(tmp_path):
    # Each level lists the previous one ten times: 10**6 values from seven short lines.
    lines = ["a0: &a0 [1, 1, 1, 1, 1, 1, 1, 1, 1, 1]"]
    lines += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 10)}]" for i in range(1, 6)]
    config = tmp_path / "f.yaml"
    config.write_text("\n".join(lines) + "\n")
    expected = f"{config}: holds more than {loading.MAX_VALUES} values (YAML aliases expand); expected a config"
    assert _file_error(config) == expected


def test_a_defaults_entry_with_a_nul_byte_is_refused(tmp_path):
    config = tmp_path / "f.yaml"
    config.write_text(yaml.safe_dump({"defaults": "base\0.yaml"}))
    line = _file_error(config)
    assert line.startswith("'") and line.endswith("': not a usable file path (embedded null byte)")


def test_well_formed_overrides_still_load():
    overrides = ["env.gym.launch=external", "env.gym.agent_urls.foo=http://127.0.0.1:1/run", "ppo.ppo_epochs=2"]
    config = load_config(DEMO, overrides)
    assert config.env.gym.agent_urls == {"foo": "http://127.0.0.1:1/run"}
    assert config.ppo.ppo_epochs == 2
