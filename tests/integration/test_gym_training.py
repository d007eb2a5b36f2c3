"""PPO through the gym end to end: policy servers on the generator hosts, the built-in head/agent/resources
servers, GymClient rollouts in the sync source, the async collector and validation; the multi-step tool task
with turn_gae on the graph engine (its prefix cache reusing each conversation's history); and training-level
faults (500, hang, dropped connection, malformed JSON, no tokens) that are retried or replaced within the
budget, or stop the run with a clear error when a step cannot be filled."""

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from faulty_agent import FaultyAgent

from asyncppo.distributed.process_group import free_port
from asyncppo.gym.servers.launch import launch_builtin_gym
from asyncppo.pipeline.errors import StepFillError

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.usefixtures("ray_cluster")]
Train = Callable[[dict[str, Any], Path], list[dict[str, Any]]]
REPO = Path(__file__).parents[2]


def gym_rows(source: Path, destination: Path, agent: str = "math_simple_agent") -> Path:
    """The arithmetic rows as gym `/run` bodies for the built-in math environment."""
    with source.open() as lines, destination.open("w") as out:
        for line in lines:
            row = json.loads(line)
            gym_row = {
                "responses_create_params": {"input": [{"role": "user", "content": row["prompt"]}]},
                "expected_answer": row["answer"],
                "agent_ref": {"type": "responses_api_agents", "name": agent},
            }
            out.write(json.dumps(gym_row) + "\n")
    return destination


def gym_tree(
    tiny_run_tree: Callable[..., dict[str, Any]], data_dir: Path, tmp_path: Path, **ppo: Any
) -> dict[str, Any]:
    tree = tiny_run_tree(data_dir, **{"max_num_steps": 3, **ppo})
    tree["data"] = {
        "train_path": str(gym_rows(data_dir / "train.jsonl", tmp_path / "train.jsonl")),
        "validation_path": str(gym_rows(data_dir / "validation.jsonl", tmp_path / "validation.jsonl")),
    }
    tree["generation"]["colocated"] = {"enabled": False}
    tree["env"] = {
        "should_use_nemo_gym": True,
        "gym": {"resources": ["math"], "max_steps": 1, "rollout_deadline_s": 60, "backoff_s": 0.05},
    }
    return tree


def test_sync_ppo_through_the_builtin_gym(
    data_dir: Path, tmp_path: Path, tiny_run_tree: Callable[..., dict[str, Any]], train_in_process: Train
):
    metrics = train_in_process(gym_tree(tiny_run_tree, data_dir, tmp_path), tmp_path / "run")
    assert [m["step"] for m in metrics] == [1, 2, 3]
    last = metrics[-1]
    # 3 steps x 4 prompts x 2 samples, plus the final validation's 4 prompts x 1 sample, all through /run.
    assert last["gym/rollouts_succeeded"] == 3 * 4 * 2 + 4
    assert last["gym/rollouts_started"] == last["gym/rollouts_succeeded"]
    assert all(m["rollout/failed_groups"] == 0 for m in metrics)
    assert last["val/num_samples"] == 4 and last["val/failed_groups"] == 0 and 0 <= last["val/reward_mean"] <= 1
    for key in ("train/reward_mean", "critic/explained_var", "policy/loss", "mismatch/token_mult_prob_error"):
        assert key in metrics[0], key
    # On CPU `auto` is the hf engine, which has no prefix cache: no prefill counters are made up for it.
    assert not any(key.startswith("generation/prefill") for m in metrics for key in m)
    # Generation logprobs came back through HTTP and agree with the trainer's recompute (fp32, same weights).
    assert metrics[0]["mismatch/token_mult_prob_error"] == pytest.approx(1.0, abs=1e-3)
    assert (tmp_path / "run" / "checkpoints" / "step_3" / "policy").is_dir()


def test_async_ppo_through_the_builtin_gym(
    data_dir: Path, tmp_path: Path, tiny_run_tree: Callable[..., dict[str, Any]], train_in_process: Train
):
    tree = gym_tree(tiny_run_tree, data_dir, tmp_path)
    tree["ppo"]["async_ppo"] = {"enabled": True, "max_trajectory_age_steps": 1}
    tree["loss_fn"] = {"use_importance_sampling_correction": True}
    # No critic (the sync run covers one through the gym): one worker process fewer to start.
    tree["ppo"]["adv_estimator"] = {"name": "raw_reward", "normalize_advantages": True}
    tree["generation"]["backend"] = "graph"  # its counters are read while the collector keeps it generating
    metrics = train_in_process(tree, tmp_path / "run")
    assert [m["step"] for m in metrics] == [1, 2, 3]
    assert all(m["async/max_policy_age"] <= 1 for m in metrics)
    assert metrics[-1]["gym/rollouts_succeeded"] >= 3 * 4 * 2 + 4
    # Single-turn prompts and no KV recompute: computed <= sent (equal unless a prompt repeats a finished one).
    sent = sum(m["generation/prefill_tokens_sent"] for m in metrics)
    assert sent > 0 and sum(m["generation/prefill_tokens_computed"] for m in metrics) <= sent
    accounting = json.loads((tmp_path / "run" / "checkpoints" / "step_3" / "accounting.json").read_text())
    assert accounting["problems"] == []
    assert sum(end - start for start, end in accounting["trained"]) == 3 * 4


def test_the_multi_step_tool_task_trains_with_turn_gae_on_the_graph_engine_reusing_histories(
    tmp_path: Path, train_in_process: Train
):
    tree = _multi_step_tree(max_num_steps=3)
    tree["generation"]["backend"] = "graph"  # what `auto` picks on GPUs; on CPU it runs eagerly
    metrics = train_in_process(tree, tmp_path / "run")
    assert [m["step"] for m in metrics] == [1, 2, 3]
    for step in metrics:
        # Several model calls per rollout (add, multiply, answer), each one turn of the turn-level critic.
        assert step["turn/num_turns_mean"] > 1.5, step
        assert 0 <= step["train/reward_mean"] <= 1
        # Each later call's prompt starts with the conversation so far, whose KV the prefix cache still holds.
        assert step["generation/prefix_hits"] > 0, step
        assert step["generation/prefill_tokens_computed"] < step["generation/prefill_tokens_sent"], step
        assert 0 < step["generation/prefill_computed_fraction"] < 1, step
    assert metrics[-1]["val/turns_per_sample"] > 1.5
    assert "critic/explained_var" in metrics[-1] and "policy/loss" in metrics[-1]
    # The multi_step environment reports reward_components {"correct_answer": reward}: its mean is logged per step
    # (equal to the reward's, no penalty being on), and for validation.
    for step in metrics:
        assert step["reward/correct_answer"] == pytest.approx(step["train/reward_mean"], abs=1e-6), step
    assert metrics[-1]["val/reward/correct_answer"] == pytest.approx(metrics[-1]["val/reward_mean"], abs=1e-6)


def _multi_step_tree(**ppo: Any) -> dict[str, Any]:
    import yaml

    tree = yaml.safe_load((REPO / "examples" / "configs" / "gym_multi_step.yaml").read_text())
    for key in ("train_path", "validation_path"):
        tree["data"][key] = str(REPO / tree["data"][key])
    tree["ppo"].update(
        {"num_prompts_per_step": 4, "num_generations_per_prompt": 2, "val_period": 0, "max_val_samples": 4, **ppo}
    )
    tree["ppo"]["val_at_start"] = False
    tree["model"].update({"train_global_batch_size": 8, "train_micro_batch_size": 8})
    tree["value"].update({"train_global_batch_size": 8, "train_micro_batch_size": 8})
    tree["checkpointing"] = {"enabled": False}
    tree["logger"] = {"console": False}
    return tree


def _external_faulty_gym(tree: dict[str, Any], script: list[str]) -> tuple[Any, FaultyAgent]:
    """Built-in servers started by the test against the policy server's fixed port, behind a faulty proxy. The run
    has no critic: the faults are the gym client's to handle, and each start is one worker process fewer."""
    tree["ppo"]["adv_estimator"] = {"name": "raw_reward", "normalize_advantages": True}
    port = free_port()
    builtin = launch_builtin_gym(f"http://127.0.0.1:{port}/v1", resources=["math"], max_steps=1)
    proxy = FaultyAgent(builtin.agent_urls["math_simple_agent"], script)
    proxy.start()
    tree["env"]["gym"] = {
        "launch": "external",
        "agent_urls": {"math_simple_agent": proxy.url},
        "policy_server_port": port,
        "rollout_deadline_s": 4,
        "max_retries": 1,
        "backoff_s": 0.05,
        "max_failed_groups_per_step": 3,
    }
    return builtin, proxy


def test_agent_faults_are_retried_or_replaced_and_counted(
    data_dir: Path, tmp_path: Path, tiny_run_tree: Callable[..., dict[str, Any]], train_in_process: Train
):
    tree = gym_tree(tiny_run_tree, data_dir, tmp_path)
    # Retried (a second attempt follows): 500, drop. Not retryable, the group is replaced: hang (the deadline
    # covers the retries), malformed JSON, a result without tokens.
    script = ["500", "ok", "drop", "ok", "hang", "ok", "ok", "malformed", "ok", "no_tokens", "ok"]
    builtin, proxy = _external_faulty_gym(tree, script)
    try:
        metrics = train_in_process(tree, tmp_path / "run")
    finally:
        proxy.stop()
        builtin.stop()
    assert [m["step"] for m in metrics] == [1, 2, 3]
    last = metrics[-1]
    assert last["gym/failures/http_500"] >= 1 and last["gym/failures/connection"] >= 1
    assert last["gym/failures/deadline"] >= 1 and last["gym/failures/malformed_json"] >= 1
    assert last["gym/retries"] >= 2
    assert sum(m["rollout/failed_groups"] for m in metrics) >= 3  # hang, malformed, no tokens
    assert last["gym/failed_groups"] >= 3
    assert all(len(m) > 0 and m["train/reward_mean"] >= 0 for m in metrics)


def test_a_step_that_cannot_be_filled_stops_the_run_with_a_clear_error(
    data_dir: Path, tmp_path: Path, tiny_run_tree: Callable[..., dict[str, Any]], train_in_process: Train
):
    tree = gym_tree(tiny_run_tree, data_dir, tmp_path)
    builtin, proxy = _external_faulty_gym(tree, ["500"])
    started = time.monotonic()
    try:
        with pytest.raises(StepFillError) as raised:
            train_in_process(tree, tmp_path / "run")
    finally:
        proxy.stop()
        builtin.stop()
    message = str(raised.value)
    assert message.startswith("step 1 could not be filled: 4 prompt groups failed")  # the first step, as in step 1/N
    assert "env.gym.max_failed_groups_per_step=3" in message and "answered 500" in message
    assert time.monotonic() - started < 120
