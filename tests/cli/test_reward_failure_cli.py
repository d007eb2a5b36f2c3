"""A reward function that raises ends `asyncppo train` with one `error:` line naming the function and the key of the
failure budget (ppo.max_failed_groups_per_step), exit status 1 and no traceback: a real run on the tiny model, in this
process on the session's Ray cluster."""

import json
from pathlib import Path

import pytest
import yaml

from asyncppo.cli.main import main
from ppo_settings import tiny_run_tree


@pytest.mark.integration
@pytest.mark.slow
@pytest.mark.usefixtures("ray_cluster", "fresh_modules")
def test_a_raising_reward_function_ends_the_run_in_one_line_naming_it(
    tmp_path: Path, shared_cache_dir: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
):
    monkeypatch.setenv("ASYNCPPO_CACHE_DIR", str(shared_cache_dir))
    (tmp_path / "raising_grader.py").write_text("def reward(text, row):\n    raise ValueError('no grade\\nfor this')\n")
    rows = tmp_path / "train.jsonl"
    rows.write_text("".join(json.dumps({"prompt": f"{n}+1=", "answer": str(n + 1)}) + "\n" for n in range(4)))
    tree = tiny_run_tree(str(rows), "raising_grader:reward")
    tree["data"]["validation_fraction"] = 0.5
    # One worker: the policy, generating in place (the reward function runs in the driver whatever the layout).
    tree["generation"]["colocated"] = {"enabled": True}
    tree["ppo"]["adv_estimator"] = {"name": "raw_reward", "normalize_advantages": True}
    del tree["value"]
    tree["logger"] = {"log_dir": str(tmp_path / "run"), "console": False, "tensorboard_enabled": False}
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(tree))

    status = main(["train", str(tmp_path / "config.yaml")])
    captured = capsys.readouterr()
    assert status == 1, captured.err
    assert "Traceback" not in captured.err
    (line,) = [line for line in captured.err.splitlines() if line.startswith("error: ")]
    assert line.startswith(
        "error: step 1 could not be filled: 1 prompt group failed while filling it, more than "
        "ppo.max_failed_groups_per_step=0; last failure (group "
    )
    assert (
        "RewardFunctionError: reward function raising_grader.reward raised ValueError: no grade for this for row"
        in line
    )
