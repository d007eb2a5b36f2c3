"""Pre-flight: each mistake a user makes in a run's inputs ends as one `error:` line and exit 2, before Ray starts.

All but one test call the CLI's `main` in-process with `init_local_ray` replaced by a tripwire; the subprocess test
proves the same for a real `python -m asyncppo train`: Ray's temp directory stays empty and no traceback shows.
"""

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from asyncppo.cli.main import main
from ppo_settings import tiny_run_tree

REPO = Path(__file__).parents[2]
pytestmark = pytest.mark.usefixtures("ray_tripwire")


def _tree(data_path: Path, reward_function: str = "exact_match") -> dict[str, Any]:
    """A tiny valid run: tiny model, 2 steps of 2 prompts x 2 samples, no validation, no checkpoints."""
    tree = tiny_run_tree(str(data_path), reward_function)
    tree["ppo"]["val_period"] = 0
    tree["checkpointing"] = {"enabled": False}
    tree["logger"] = {"console": False, "tensorboard_enabled": False}
    return tree


def _write_rows(path: Path, rows: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


GOOD_ROWS = [{"prompt": "What is 1+1?", "answer": "2"}, {"prompt": "What is 2+2?", "answer": "4"}]


def _config(tmp_path: Path, tree: dict[str, Any]) -> Path:
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(tree))
    return path


def _only_error(capsys: pytest.CaptureFixture[str], config: Path, tmp_path: Path) -> str:
    """Train `config`; assert exit 2, one `error:` line, no traceback, no run directory; return the line."""
    run_dir = tmp_path / "run"
    status = main(["train", str(config), "--run-dir", str(run_dir)])
    captured = capsys.readouterr()
    assert status == 2, captured.err
    errors = [line for line in captured.err.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1, captured.err
    assert "Traceback" not in captured.err
    assert not run_dir.exists()  # nothing is written before the checks pass
    return errors[0]


def test_a_missing_data_file_names_the_key_and_where_relative_paths_resolve(tmp_path, capsys):
    config = _config(tmp_path, _tree(tmp_path / "no_such.jsonl"))
    line = _only_error(capsys, config, tmp_path)
    assert line.startswith(f"error: data.train_path: '{tmp_path / 'no_such.jsonl'}' does not exist")
    assert f"working directory {Path.cwd()}" in line


def test_an_empty_data_file_is_refused(tmp_path, capsys):
    tree = _tree(_write_rows(tmp_path / "train.jsonl", GOOD_ROWS))
    tree["data"]["validation_path"] = str(_write_rows(tmp_path / "validation.jsonl", []))
    line = _only_error(capsys, _config(tmp_path, tree), tmp_path)
    assert line.startswith(f"error: data.validation_path: {tmp_path / 'validation.jsonl'} holds no rows;")


def test_bad_jsonl_names_the_file_and_line(tmp_path, capsys):
    data = tmp_path / "train.jsonl"
    data.write_text(json.dumps(GOOD_ROWS[0]) + "\n\n" + '{"prompt": "What is 3+3?", "answer": 6\n')
    line = _only_error(capsys, _config(tmp_path, _tree(data)), tmp_path)
    assert line.startswith(f"error: data.train_path: {data} line 3: invalid JSON (")
    assert line.endswith("; fix the file or point data.train_path at another")


def test_a_row_without_the_prompt_field_names_the_key_and_the_fields_it_has(tmp_path, capsys):
    data = _write_rows(tmp_path / "train.jsonl", [{"question": "What is 1+1?", "answer": "2"}])
    line = _only_error(capsys, _config(tmp_path, _tree(data)), tmp_path)
    assert line == (
        f"error: data.prompt_key: {data} row 0 (line 1) has neither the prompt field 'prompt' (data.prompt_key) nor "
        "the chat field 'messages' (data.messages_key), only ['answer', 'question']; set data.prompt_key or "
        "data.messages_key to the field that holds the prompt"
    )


def test_a_row_with_a_malformed_response_budget_names_the_row_and_the_value(tmp_path, capsys):
    rows = [{**GOOD_ROWS[0], "budget": [3, 4]}, {**GOOD_ROWS[1], "budget": [3, 4, 5]}]  # 2 samples per prompt
    tree = _tree(_write_rows(tmp_path / "train.jsonl", rows))
    tree["data"]["max_new_tokens_key"] = "budget"
    line = _only_error(capsys, _config(tmp_path, tree), tmp_path)
    assert line == (
        "error: data.max_new_tokens_key: training row 1: 'budget' (data.max_new_tokens_key) must be a positive int "
        "or a list of 2 positive ints (one per sample), got [3, 4, 5]"
    )


def test_a_reward_function_with_the_wrong_signature_is_refused(tmp_path, capsys, fresh_modules):
    (tmp_path / "one_argument_reward.py").write_text("def reward(response_text):\n    return 1.0\n")
    data = _write_rows(tmp_path / "train.jsonl", GOOD_ROWS)
    config = _config(tmp_path, _tree(data, "one_argument_reward:reward"))
    line = _only_error(capsys, config, tmp_path)
    assert line.startswith(
        "error: env.reward_function: 'one_argument_reward:reward' has the signature (response_text) and cannot be "
        "called as reward(response_text, row) ("
    )


def test_an_enabled_sink_without_its_package_names_the_key_and_the_install(tmp_path, capsys):
    if importlib.util.find_spec("wandb") is not None:
        pytest.skip("wandb is installed here: the missing-package case cannot happen")
    tree = _tree(_write_rows(tmp_path / "train.jsonl", GOOD_ROWS))
    tree["logger"]["wandb_enabled"] = True
    line = _only_error(capsys, _config(tmp_path, tree), tmp_path)
    assert line == (
        "error: logger.wandb_enabled: true needs the 'wandb' package, which is not installed; `pip install wandb` "
        "(or the extra: `pip install 'asyncppo[wandb]'`), or set logger.wandb_enabled: false"
    )


def test_a_warmup_longer_than_a_shortened_run_is_clamped_with_a_note(capsys):
    # gym_multi_step warms up for 5 optimizer steps; 2 PPO steps x 2 epochs x 1 global batch make 4.
    status = main(["config", "show", str(REPO / "examples/configs/gym_multi_step.yaml"), "ppo.max_num_steps=2"])
    captured = capsys.readouterr()
    assert status == 0
    assert yaml.safe_load(captured.out)["model"]["scheduler"]["warmup_steps"] == 4
    assert captured.err == (
        "note: model.scheduler.warmup_steps: 5 clamped to 4, the run's optimizer steps (ppo.max_num_steps=2 x "
        "ppo.ppo_epochs=2 x 1 per pass): the learning rate warms up over the whole run (set "
        "model.scheduler.total_steps to keep the schedule)\n"
    )


def test_a_reward_module_that_does_not_import_stops_the_real_command_before_ray(tmp_path):
    data = _write_rows(tmp_path / "train.jsonl", GOOD_ROWS)
    config = _config(tmp_path, _tree(data, "no_such_reward_module:reward"))
    ray_tmp = tmp_path / "ray"
    ray_tmp.mkdir()
    env = {**os.environ, "RAY_TMPDIR": str(ray_tmp), "ASYNCPPO_CACHE_DIR": str(tmp_path / "cache")}
    env.pop("PYTHONPATH", None)
    result = subprocess.run(
        [sys.executable, "-m", "asyncppo", "train", str(config), "--run-dir", str(tmp_path / "run")],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    assert result.stderr.splitlines() == [
        "error: env.reward_function: cannot import module 'no_such_reward_module' (ModuleNotFoundError: No module "
        f"named 'no_such_reward_module'); the config's directory {tmp_path.resolve()} and the working directory "
        f"{tmp_path.resolve()} are on the import path: put no_such_reward_module.py there, or install the module"
    ]
    assert list(ray_tmp.iterdir()) == []  # Ray never started: it writes its session directory here first
    assert not (tmp_path / "run").exists()
