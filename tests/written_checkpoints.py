"""Real checkpoints without Ray, for the resume tests: the run's own save path (`RunCheckpoints.save`) writes every
file, from the config's own batch source (sync, or async with its collector and buffer) fed by instant rollouts and,
when given, from in-process policy and critic workers that the real PPO step trained on each batch.

    write_run(config, run_dir, rows, save_at={2, 3}, workers=in_process_workers(config))
        -> run_dir/checkpoints/step_2, step_3: policy/ value/ batch_source.pt accounting.json rng.pt run_state.json
           config.yaml manifest.json training_info.json
"""

from collections.abc import Collection, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from asyncppo.config import RunConfig
from asyncppo.pipeline.failures import StepFailureBudget
from asyncppo.pipeline.sources import GroupOutcome
from asyncppo.trainer import builders
from asyncppo.trainer.ppo_step import ppo_step
from asyncppo.trainer.run_checkpoints import RunCheckpoints, checkpoint_manager
from asyncppo.trainer.run_inputs import RolloutFunctions, batch_source
from asyncppo.trainer.setup import resolve_setup
from asyncppo.types import MessageSpan, Trajectory, collate_trajectories
from asyncppo.workers.policy_worker import PolicyWorker
from asyncppo.workers.value_worker import ValueWorker

Row = dict[str, Any]


def prompt_rows(count: int) -> list[Row]:
    return [{"prompt": f"{n}+1=", "answer": str(n + 1)} for n in range(count)]


def _trajectory(row: Row, group_id: int, sample_index: int) -> Trajectory:
    # A 3-token prompt and 2 generated tokens (ids valid in every tiny vocabulary); rewards differ within a group.
    return Trajectory(
        token_ids=[5, 6, 7, 10 + sample_index, 12],
        loss_mask=[0, 0, 0, 1, 1],
        generation_logprobs=[0.0, 0.0, 0.0, -0.7, -1.1],
        prompt_length=3,
        message_log=[MessageSpan("user", 3), MessageSpan("assistant", 2)],
        reward=float(sample_index % 2),
        group_id=group_id,
        sample_index=sample_index,
        policy_version=0,
        last_policy_version=0,
        task=dict(row),
    )


def instant_rollouts(group_size: int) -> RolloutFunctions:
    """Rollouts that answer at once: `group_size` trajectories per prompt."""

    def train(rows: Sequence[Row], group_ids: Sequence[int]) -> list[GroupOutcome]:
        return [
            [_trajectory(row, group_id, index) for index in range(group_size)]
            for row, group_id in zip(rows, group_ids, strict=True)
        ]

    def validation(rows: Sequence[Row]) -> Any:
        raise AssertionError("these runs do not validate")

    return RolloutFunctions(train, validation, StepFailureBudget(0, "ppo.max_failed_groups_per_step"))


@dataclass
class InProcessWorkers:
    """The run's policy and critic workers, built in this process by the run's own factories."""

    policy: PolicyWorker
    value: ValueWorker | None
    pad_token_id: int


def in_process_workers(config: RunConfig) -> InProcessWorkers:
    setup = resolve_setup(config, None, data=False)
    value = builders.value_factory(setup)() if config.value is not None else None
    return InProcessWorkers(builders.policy_factory(setup, colocated=False)(), value, setup.pad_token_id)


def write_run(
    config: RunConfig,
    run_dir: Path,
    rows: list[Row],
    save_at: Collection[int],
    workers: InProcessWorkers | None = None,
) -> list[Path]:
    """Run the config's batch source for max(save_at) steps (training `workers` on each batch, when given) and save
    a checkpoint after each step in `save_at`; returns the checkpoints, in step order."""
    manager = checkpoint_manager(config, run_dir)
    assert manager is not None, "checkpointing.enabled must be true"
    rollouts = instant_rollouts(config.ppo.num_generations_per_prompt)
    source = batch_source(config, rows, rollouts, lambda _seed: None, start_step=0)
    policy: Any = workers.policy if workers is not None else None  # in-process workers stand in for their groups
    value: Any = workers.value if workers is not None else None
    checkpoints = RunCheckpoints(manager, config, policy, value, source, resume_from=None)
    settings = builders.step_settings(config)
    written: list[Path] = []
    try:
        for step in range(max(save_at)):
            batch = source.next_batch(step)
            if workers is not None:
                train_batch = collate_trajectories(batch.trajectories, workers.pad_token_id)
                ppo_step(settings, workers.policy, workers.value, train_batch, step)
            with source.weight_update(step + 1):
                pass
            if step + 1 in save_at:
                saved = checkpoints.save(step + 1, {}, policy_has_trained=workers is not None)
                assert saved is not None
                written.append(saved)
    finally:
        source.close()
    return written
