"""A custom reward written as the README's "Custom rewards" says, trained from a fresh directory for 3 steps.

The reward module and the config sit in a new directory, which is the working directory of a real
`python -P -m asyncppo train config.yaml` (-P: the working directory is not put on sys.path by Python, as with
the installed `asyncppo` command) with no PYTHONPATH: the module imports only because asyncppo searches the
config's directory and the working directory.
"""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from asyncppo.config.loading import load_yaml_tree

REPO = Path(__file__).parents[2]
EXAMPLE = REPO / "examples" / "rewards"


@pytest.mark.integration
@pytest.mark.slow
def test_a_custom_reward_module_beside_the_config_trains_for_three_steps(tmp_path, cache_dir):
    project = tmp_path / "my_project"
    project.mkdir()
    shutil.copy(EXAMPLE / "contains_answer.py", project / "my_reward.py")
    tree = load_yaml_tree(EXAMPLE / "custom_reward.yaml")  # the example, its `defaults:` merged in
    data = REPO / "examples" / "data" / "arithmetic"
    tree["model"].update(
        model_name="tiny:tiny", train_global_batch_size=4, train_micro_batch_size=4, max_total_sequence_length=128
    )
    tree["model"]["scheduler"]["warmup_steps"] = 0
    tree["data"].update(train_path=str(data / "train.jsonl"), validation_path=str(data / "validation.jsonl"))
    tree["generation"].update(max_new_tokens=4, max_batch_size=8)
    tree["env"]["reward_function"] = "my_reward:reward"
    tree["ppo"].update(num_prompts_per_step=2, num_generations_per_prompt=2, ppo_epochs=1, val_at_end=False)
    # One worker instead of the demo's three (policy, critic, generator): the driver imports the reward module and
    # scores every rollout with it whichever workers generate, and each worker costs a process start.
    tree["generation"]["colocated"]["enabled"] = True
    tree["ppo"]["async_ppo"]["enabled"] = False
    tree["ppo"]["adv_estimator"] = {"name": "raw_reward", "normalize_advantages": True}
    del tree["value"]  # raw_reward trains no critic
    tree["logger"].update(log_dir="run", console=False, tensorboard_enabled=False)
    (project / "config.yaml").write_text(yaml.safe_dump(tree))

    env = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
    env["ASYNCPPO_CACHE_DIR"] = str(cache_dir)
    result = subprocess.run(
        [sys.executable, "-P", "-m", "asyncppo", "train", "config.yaml", "ppo.max_num_steps=3"],
        cwd=project,
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    metrics = [json.loads(line) for line in (project / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [record["step"] for record in metrics] == [1, 2, 3]
    assert all(0.0 <= record["train/reward_mean"] <= 1.0 for record in metrics)
