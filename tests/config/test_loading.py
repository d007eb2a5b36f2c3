"""YAML loading, `defaults:` inheritance, typed dotted overrides and the one-line error format."""

from pathlib import Path

import pytest
import yaml

from asyncppo.config import ConfigError, RunConfig, dump_config, load_config, validate_tree
from asyncppo.config.loading import apply_overrides

DEMO = Path(__file__).parents[2] / "examples" / "configs" / "demo.yaml"


def _write(path: Path, tree: dict) -> Path:
    path.write_text(yaml.safe_dump(tree))
    return path


def test_overrides_are_typed_by_the_schema(tree):
    config = validate_tree(
        apply_overrides(
            tree,
            [
                "ppo.ppo_epochs=3",
                "model.optimizer.lr=1e-4",
                "generation.stop_token_ids=[5, 7]",
                "ppo.seq_logprob_error_threshold=null",
                "model.model_name=123",  # a str field keeps the text, it does not become the int 123
                "logger.wandb_enabled=true",
            ],
        )
    )
    assert config.ppo.ppo_epochs == 3
    assert config.model.optimizer.lr == pytest.approx(1e-4)
    assert config.generation.stop_token_ids == [5, 7]
    assert config.ppo.seq_logprob_error_threshold is None
    assert config.model.model_name == "123"
    assert config.logger.wandb_enabled is True


def test_unknown_override_names_the_full_path_and_the_close_match(tree):
    with pytest.raises(ConfigError) as caught:
        apply_overrides(tree, ["ppo.ppo_epochz=3"])
    assert caught.value.lines == ["ppo.ppo_epochz: unknown key; did you mean 'ppo.ppo_epochs'?"]


def test_unknown_yaml_key_names_the_full_path_and_the_close_match(tree):
    tree["ppo"]["adv_estimator"]["gae_lamda"] = 0.9
    with pytest.raises(ConfigError) as caught:
        validate_tree(tree)
    assert caught.value.lines == [
        "ppo.adv_estimator.gae_lamda: unknown key; did you mean 'ppo.adv_estimator.gae_lambda'?"
    ]


def test_override_below_a_plain_value_is_rejected(tree):
    with pytest.raises(ConfigError, match=r"ppo.ppo_epochs.x: unknown key \(ppo.ppo_epochs is a value"):
        apply_overrides(tree, ["ppo.ppo_epochs.x=1"])


def test_malformed_override_is_rejected(tree):
    with pytest.raises(ConfigError, match=r"must look like section\.key=value"):
        apply_overrides(tree, ["ppo.ppo_epochs"])


def test_free_form_sections_accept_any_subkey(tree):
    overrides = ["env.gym.launch=external", "env.gym.agent_urls.math_agent=http://127.0.0.1:8001"]
    config = validate_tree(apply_overrides(tree, overrides))
    assert config.env.gym.agent_urls == {"math_agent": "http://127.0.0.1:8001"}


def test_missing_required_key_names_its_path(tree):
    del tree["value"]["train_micro_batch_size"]
    with pytest.raises(ConfigError) as caught:
        validate_tree(tree)
    assert caught.value.lines == ["value.train_micro_batch_size: required key is missing"]


def test_type_errors_name_the_path_and_the_value(tree):
    tree["generation"] = {"top_k": "many"}
    with pytest.raises(ConfigError) as caught:
        validate_tree(tree)
    (line,) = caught.value.lines
    assert line.startswith("generation.top_k: Input should be a valid integer")
    assert line.endswith("(got 'many')")


def test_defaults_are_merged_with_the_child_winning(tmp_path, tree):
    _write(tmp_path / "base.yaml", tree)
    child = _write(tmp_path / "child.yaml", {"defaults": "base.yaml", "ppo": {"ppo_epochs": 2}})
    config = load_config(child)
    assert config.ppo.ppo_epochs == 2
    assert config.ppo.num_generations_per_prompt == tree["ppo"]["num_generations_per_prompt"]


def test_cyclic_defaults_are_reported(tmp_path):
    _write(tmp_path / "a.yaml", {"defaults": "b.yaml"})
    _write(tmp_path / "b.yaml", {"defaults": "a.yaml"})
    with pytest.raises(ConfigError, match="defaults form a cycle"):
        load_config(tmp_path / "a.yaml")


def test_missing_and_invalid_files_are_reported(tmp_path):
    with pytest.raises(ConfigError, match="config file not found"):
        load_config(tmp_path / "absent.yaml")
    (tmp_path / "list.yaml").write_text("- 1\n- 2\n")
    with pytest.raises(ConfigError, match="expected a mapping"):
        load_config(tmp_path / "list.yaml")


def test_resolved_config_round_trips_through_its_dump(tmp_path):
    config = load_config(DEMO, ["ppo.ppo_epochs=3"])
    dumped = _write(tmp_path / "resolved.yaml", yaml.safe_load(dump_config(config)))
    assert load_config(dumped) == config


def test_every_field_has_a_docstring():
    from asyncppo.config.schema_walk import section_of

    undocumented = []
    pending = [("", RunConfig)]
    while pending:
        prefix, section = pending.pop()
        for name, info in section.model_fields.items():
            if not info.description:
                undocumented.append(prefix + name)
            child = section_of(info.annotation)
            if child is not None:
                pending.append((f"{prefix}{name}.", child))
    assert undocumented == []
