"""`asyncppo config show|keys` as a user runs them: output and exit status of the command's `main`, in-process
(a process start costs ~8 s); the tests of what only a real process shows (no traceback, an encodable stderr) run
`python -m asyncppo` in a subprocess."""

import os
import subprocess
import sys
from pathlib import Path

import yaml
from in_process import run_asyncppo as _asyncppo

from asyncppo.cli.main import main

REPO = Path(__file__).parents[2]
DEMO = "examples/configs/demo.yaml"


def _asyncppo_process(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    return subprocess.run(
        [sys.executable, "-m", "asyncppo", *args], cwd=REPO, capture_output=True, text=True, env=env, timeout=120
    )


def test_config_show_prints_the_resolved_config_with_overrides():
    result = _asyncppo("config", "show", DEMO, "ppo.ppo_epochs=3")
    assert result.returncode == 0, result.stderr
    shown = yaml.safe_load(result.stdout)
    assert shown["ppo"]["ppo_epochs"] == 3
    assert shown["generation"]["top_k"] == 0  # schema defaults are written out too


def test_config_show_rejects_a_typo_in_one_line_without_a_traceback():
    result = _asyncppo_process("config", "show", DEMO, "ppo.ppo_epochz=3")
    assert result.returncode == 2
    assert result.stdout == ""
    assert result.stderr == "error: ppo.ppo_epochz: unknown key; did you mean 'ppo.ppo_epochs'?\n"


def test_config_show_names_a_dropped_required_key(tmp_path):
    tree = yaml.safe_load((REPO / DEMO).read_text())
    del tree["ppo"]["adv_estimator"]["residual_baseline"]
    broken = tmp_path / "broken.yaml"
    broken.write_text(yaml.safe_dump(tree))
    result = _asyncppo("config", "show", str(broken))
    assert result.returncode == 2
    assert result.stderr == "error: ppo.adv_estimator.residual_baseline: required when name='gae' (missing)\n"
    assert "Traceback" not in result.stderr


def test_config_keys_lists_documented_keys_under_a_prefix():
    result = _asyncppo("config", "keys", "ppo.async_ppo")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines and all(line.startswith("ppo.async_ppo.") for line in lines)
    expected = "ppo.async_ppo.max_trajectory_age_steps (default 1): Staleness window"
    assert any(line.startswith(expected) for line in lines)


def test_config_keys_rejects_a_prefix_that_names_no_key(capsys):
    assert main(["config", "keys", "ppo.async_ppo.max_trajectory_age"]) == 0  # a prefix of a key is enough
    capsys.readouterr()
    assert main(["config", "keys", "ppo.asynk_ppo.enabled"]) == 2
    assert capsys.readouterr().err == (
        "error: ppo.asynk_ppo.enabled: no config key starts with this prefix; did you mean 'ppo.async_ppo.enabled'?\n"
    )


def test_config_show_drops_the_critic_of_raw_reward_with_one_note():
    result = _asyncppo(
        "config", "show", DEMO, "ppo.adv_estimator.name=raw_reward", "ppo.adv_estimator.residual_baseline=false"
    )
    assert result.returncode == 0, result.stderr
    assert yaml.safe_load(result.stdout)["value"] is None
    assert (
        result.stderr
        == "note: value: ignored (section dropped): ppo.adv_estimator.name='raw_reward' trains no critic\n"
    )


def test_config_show_rejects_a_ranking_metric_the_run_never_logs():
    result = _asyncppo("config", "show", DEMO, "checkpointing.keep_top_k=2", "checkpointing.metric_name=val:accuracy")
    assert result.returncode == 2
    assert result.stdout == ""
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith(
        "error: checkpointing.metric_name: 'val:accuracy' is not a metric the run logs (NeMo-RL's val:accuracy is "
        "val:reward_mean here); expected one of val:reward_mean, "
    )


def test_config_show_refuses_a_file_that_is_not_utf8_in_one_line(tmp_path):
    config = tmp_path / "f.yaml"
    config.write_bytes(b"ppo:\n  ppo_epochs: \xff\n")
    result = _asyncppo_process("config", "show", str(config))
    assert result.returncode == 2
    assert result.stdout == ""
    assert result.stderr == f"error: {config}: not UTF-8 text (byte 0xff on line 2); expected a UTF-8 YAML file\n"
