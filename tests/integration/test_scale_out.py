"""Scale-out on a local Ray cluster (gloo, CPU): 2 data-parallel policy and critic ranks + 2 generator workers.

Each run's PPO steps are recorded as they happen (the real `ppo_step`, wrapped) and replayed on one in-process
rank from the same initial weights: every loss metric of every step must agree within 1e-5, so the sharded
scoring, the sum-reduced gradients, the global loss normalisation and (after a rank is killed) the restored
sharded optimizer state all equal one process's.
"""

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import ray
import torch
from safetensors.torch import load_file

from asyncppo.config import ConfigError, RunConfig, validate_tree
from asyncppo.metrics import read_metrics_jsonl
from asyncppo.trainer import builders, loop
from asyncppo.trainer.build import build_run
from asyncppo.trainer.ppo_step import StepOutput, ppo_step
from asyncppo.trainer.setup import resolve_setup
from asyncppo.types import TrainBatch
from asyncppo.workers.policy_worker import PolicyWorker
from asyncppo.workers.ray_host import WorkerCallError

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.usefixtures("ray_cluster")]

Recorded = tuple[int, TrainBatch, dict[str, float]]
TOLERANCE = 1e-5


def _two_rank_tree(tiny_run_tree: Callable[..., dict[str, Any]], data_dir: Path, **ppo: Any) -> dict[str, Any]:
    tree = tiny_run_tree(data_dir, max_num_steps=3, val_at_end=False, **ppo)
    tree["generation"].update({"colocated": {"enabled": False}, "num_workers": 2})
    tree["cluster"]["gpus_per_node"] = 4  # 4 devices - 2 generators = 2 trainer devices: 2 policy + 2 critic ranks
    tree["logger"]["tensorboard_enabled"] = False
    return tree


def _recording_ppo_step(recorded: list[Recorded], before_step: Callable[[int], None]) -> Callable[..., StepOutput]:
    def step(*args: Any, **kwargs: Any) -> StepOutput:
        batch, step_index = args[3], args[4]
        before_step(step_index)
        output = ppo_step(*args, **kwargs)
        recorded.append((step_index, batch, output.metrics))
        return output

    return step


def _replay_on_one_rank(config: RunConfig, recorded: list[Recorded]) -> tuple[list[dict[str, float]], PolicyWorker]:
    """The recorded steps, in order, on in-process workers loaded from the run's initial model: their metrics, and
    the policy after them."""
    setup = resolve_setup(config)
    policy = builders.policy_factory(setup, colocated=False)()
    value = builders.value_factory(setup)() if config.value is not None else None
    settings = builders.step_settings(config)
    return [ppo_step(settings, policy, value, batch, step).metrics for step, batch, _ in recorded], policy


def _assert_weights_match(checkpoint: Path, policy: PolicyWorker) -> None:
    saved = load_file(checkpoint / "model.safetensors")
    replayed = policy.weights()
    common = saved.keys() & replayed.keys()  # the checkpoint may also name a tied head
    assert common == replayed.keys(), replayed.keys() - common
    worst = max((saved[name] - replayed[name]).abs().max().item() for name in common)
    assert worst <= TOLERANCE, worst


def _assert_losses_match(recorded: list[Recorded], replayed: list[dict[str, float]], critic: bool = True) -> None:
    assert [step for step, _, _ in recorded] == list(range(len(replayed)))
    for (step, _, two_ranks), one_rank in zip(recorded, replayed, strict=True):
        keys = [
            key for key in one_rank if key.endswith(("loss", "grad_norm")) and key.startswith(("policy/", "critic/"))
        ]
        assert {"policy/loss", "critic/loss"} <= set(keys) if critic else "policy/loss" in keys
        for key in keys:
            assert two_ranks[key] == pytest.approx(one_rank[key], abs=TOLERANCE, rel=TOLERANCE), (step, key)


def test_two_data_parallel_ranks_and_two_generators_sync_match_one_rank(
    data_dir: Path, tmp_path: Path, tiny_run_tree: Callable[..., dict[str, Any]], monkeypatch: pytest.MonkeyPatch
):
    config = validate_tree(_two_rank_tree(tiny_run_tree, data_dir))
    recorded: list[Recorded] = []
    monkeypatch.setattr(loop, "ppo_step", _recording_ppo_step(recorded, lambda _: None))
    run = build_run(config, tmp_path)
    try:
        workers = run.workers
        assert len(workers.policy) == 2 and workers.value is not None and len(workers.value.group) == 2
        assert len(workers.generator.group) == 2
        loop.train(run)
    finally:
        run.close()
    replayed, policy = _replay_on_one_rank(config, recorded)
    _assert_losses_match(recorded, replayed)
    _assert_weights_match(tmp_path / "checkpoints" / "step_3" / "policy", policy)  # 3 identical updates
    assert [m["step"] for m in read_metrics_jsonl(tmp_path / "metrics.jsonl")] == [1, 2, 3]


def test_async_two_ranks_survive_a_killed_rank_and_resume_to_one_rank_losses(
    data_dir: Path, tmp_path: Path, tiny_run_tree: Callable[..., dict[str, Any]], monkeypatch: pytest.MonkeyPatch
):
    tree = _two_rank_tree(tiny_run_tree, data_dir, async_ppo={"enabled": True, "max_trajectory_age_steps": 1})
    tree["loss_fn"] = {"use_importance_sampling_correction": True}
    # Policy ranks only (the sync test covers the critic's) and one generator (the sync test covers two): each of
    # the two starts is 3 processes instead of 6.
    tree["ppo"]["adv_estimator"] = {"name": "raw_reward", "normalize_advantages": True}
    tree["generation"]["num_workers"] = 1
    tree["cluster"]["gpus_per_node"] = 3  # 3 devices - 1 generator = 2 trainer devices: 2 policy ranks
    config = validate_tree(tree)
    recorded: list[Recorded] = []
    killed: list[int] = []
    run = build_run(config, tmp_path)

    def kill_policy_rank_1_before_step_3(step: int) -> None:
        if step == 2 and not killed:  # steps 1 and 2 are done and checkpointed (save_period 1)
            killed.append(step)
            ray.kill(run.workers.policy.group.hosts[1])

    monkeypatch.setattr(loop, "ppo_step", _recording_ppo_step(recorded, kill_policy_rank_1_before_step_3))
    try:
        with pytest.raises(WorkerCallError, match=r"the policy worker \(rank 1, pid \d+\) died during step 3: "):
            loop.train(run)
    finally:
        run.close()
    assert killed == [2] and [step for step, _, _ in recorded] == [0, 1]
    run = build_run(config, tmp_path)  # resumes from step_2: the sharded optimizer state of both ranks
    try:
        loop.train(run)
    finally:
        run.close()
    replayed, policy = _replay_on_one_rank(config, recorded)
    _assert_losses_match(recorded, replayed, critic=False)
    _assert_weights_match(tmp_path / "checkpoints" / "step_3" / "policy", policy)
    metrics = read_metrics_jsonl(tmp_path / "metrics.jsonl")
    assert [m["step"] for m in metrics] == [1, 2, 3]
    assert "async/avg_policy_age" in metrics[-1]
    assert torch.load(tmp_path / "checkpoints" / "step_3" / "policy" / "optimizer.pt", weights_only=True)["state"]


def test_a_run_asking_for_more_devices_than_the_ray_cluster_has_fails_at_start_naming_the_numbers(
    data_dir: Path, tmp_path: Path, tiny_run_tree: Callable[..., dict[str, Any]]
):
    tree = _two_rank_tree(tiny_run_tree, data_dir)
    tree["cluster"]["gpus_per_node"] = 8  # 6 trainer devices; the session's cluster has 4 logical CPUs
    with pytest.raises(ConfigError) as raised:
        build_run(validate_tree(tree), tmp_path)
    assert raised.value.lines == [
        "cluster: the trainers need 6 CPU devices but the Ray cluster has 4 in all; lower the run's devices "
        "(docs/multi-node.md) or grow the cluster"
    ]
