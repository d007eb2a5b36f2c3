"""The shipped async gym example (examples/configs/gym_async.yaml) trains as shipped: 3 steps on CPU, in process on
the session's Ray cluster, with only the step count and the run directory changed."""

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.usefixtures("ray_cluster")]
REPO = Path(__file__).parents[2]
CONFIG = REPO / "examples" / "configs" / "gym_async.yaml"


def test_the_async_gym_example_trains_non_colocated_with_a_turn_level_critic(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, train_in_process: Callable[[dict[str, Any], Path], list[dict]]
):
    tree = yaml.safe_load(CONFIG.read_text())
    tree["ppo"]["max_num_steps"] = 3
    monkeypatch.chdir(REPO)  # the data paths are relative to the repository root, as for `asyncppo train`
    metrics = train_in_process(tree, tmp_path / "run")

    assert [m["step"] for m in metrics] == [1, 2, 3]
    # Async: step 1 trains on the initial weights' rollouts, later steps on rollouts one update old.
    assert [m["async/max_policy_age"] for m in metrics] == [0.0, 1.0, 1.0]
    for step in metrics:
        assert step["rollout/failed_groups"] == 0, step
        # The multi-step tool task through the built-in gym: several model calls (turns) per rollout.
        assert step["turn/num_turns_mean"] > 1.5, step
        assert "critic/explained_var" in step and "policy/loss" in step
        # logger.metric_aliases: nemo_rl, and each step is one global batch: NeMo-RL's names ride along.
        assert step["train/token_mult_prob_error"] == step["policy/token_mult_prob_error"]
        assert step["train/avg_trajectory_age"] == step["async/avg_trajectory_age"]
    placement = json.loads((tmp_path / "run" / "placement.json").read_text())
    assert sorted(record["role"] for record in placement) == ["generator", "policy", "value"]  # non-colocated
    assert (tmp_path / "run" / "checkpoints" / "step_3" / "value").is_dir()
