"""Model and tokenizer names resolve to local directories, or fail as one config error naming the key."""

from pathlib import Path

import pytest

from asyncppo.config import ConfigError, load_config
from asyncppo.trainer.setup import ModelPaths, resolve_model_path

DEMO = Path(__file__).parents[2] / "examples" / "configs" / "demo.yaml"


def test_a_tokenizer_that_is_not_a_local_directory_names_its_key(tmp_path: Path):
    with pytest.raises(ConfigError) as raised:
        resolve_model_path(str(tmp_path / "no-such-tokenizer"), "model.tokenizer")
    assert raised.value.lines == [
        f"model.tokenizer: {str(tmp_path / 'no-such-tokenizer')!r} is not a local Hugging Face model directory "
        "(no config.json)"
    ]


def test_an_unknown_demo_name_lists_the_demo_models():
    with pytest.raises(ConfigError) as raised:
        resolve_model_path("demo:nope", "model.tokenizer")
    assert raised.value.lines == [
        "model.tokenizer: unknown demo model 'nope'; expected one of ['arithmetic', 'multi_step']"
    ]


def test_a_local_model_directory_is_its_own_path(tmp_path: Path):
    (tmp_path / "config.json").write_text("{}")
    assert resolve_model_path(str(tmp_path), "model.tokenizer") == tmp_path


def test_the_runs_tokenizer_is_checked_before_anything_loads(tmp_path: Path):
    (tmp_path / "config.json").write_text("{}")
    config = load_config(DEMO, [f"model.model_name={tmp_path}", f"model.tokenizer={tmp_path / 'missing'}"])
    with pytest.raises(ConfigError) as raised:
        ModelPaths.resolve(config)
    assert raised.value.lines[0].startswith("model.tokenizer: ")
