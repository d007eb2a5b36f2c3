"""Offline critic pretraining, part 2: the value model alone, trained on the shards (`asyncppo critic pretrain`).

    critic_data/shard_*.jsonl --held_out_split (by prompt, whole groups)--> train rollouts | held-out rollouts
    train: steps x (batch_size random rollouts --reward-to-go targets--> ValueWorker.train: one optimizer step)
    every eval_period steps (and at 0 and the end): held-out value loss, explained variance, terminal AUC
    --> critic_pretrain/metrics.jsonl, critic_pretrain/value/ (what value.warm_start_path takes)

Targets are the lambda = 1 returns in the critic's own space (`algorithms/offline_critic.py`): with the residual
baseline, minus the leave-one-out baseline of the rollout's whole group. The held-out explained variance is
computed as the PPO step's pre-update `critic/explained_var`. Value clipping is off: there are no old values.
"""

import dataclasses
import math
import random
import shutil
from collections.abc import Sequence
from pathlib import Path

import torch

from asyncppo.algorithms import residual
from asyncppo.algorithms.critic_metrics import pooled_explained_variance
from asyncppo.algorithms.masked import masked_mean
from asyncppo.algorithms.offline_critic import held_out_split, offline_critic_targets, terminal_auc, terminal_values
from asyncppo.checkpoint import mark_warm_start
from asyncppo.config import ConfigError, RunConfig
from asyncppo.metrics import JsonlSink
from asyncppo.rollout.shards import read_shards
from asyncppo.trainer import builders
from asyncppo.trainer.critic_collection import CRITIC_DATA_DIR
from asyncppo.trainer.ppo_step import turn_spans_of
from asyncppo.trainer.setup import RunSetup
from asyncppo.types import TrainBatch, Trajectory, collate_trajectories
from asyncppo.workers.value_worker import ValueWorker

CRITIC_PRETRAIN_DIR = "critic_pretrain"
VALUE_DIR = "value"
METRICS_FILE = "metrics.jsonl"
PREFIX = "critic_pretrain/"


@dataclasses.dataclass(frozen=True)
class Rollouts:
    """The shards' trajectories with what targets need of their whole groups: baseline and critic sample mask `[N]`."""

    trajectories: list[Trajectory]
    baseline: torch.Tensor
    critic_sample_mask: torch.Tensor


def _rollouts(config: RunConfig, trajectories: list[Trajectory]) -> Rollouts:
    rewards = torch.tensor([t.reward for t in trajectories], dtype=torch.float32)
    group_ids = torch.tensor([t.group_id for t in trajectories], dtype=torch.long)
    sample_mask = torch.tensor([0.0 if t.mask_sample else 1.0 for t in trajectories])
    baseline, _ = residual.leave_one_out_baseline(rewards, group_ids)
    homogeneous, _ = residual.group_composition(rewards, group_ids, baseline, sample_mask)
    weight = config.value_loss_fn.homogeneous_group_weight
    critic_sample_mask = residual.homogeneous_group_sample_mask(sample_mask, homogeneous, weight)
    return Rollouts(trajectories, baseline, critic_sample_mask)


def target_batch(
    config: RunConfig, rollouts: Rollouts, indices: Sequence[int], pad_token_id: int
) -> tuple[TrainBatch, torch.Tensor, torch.Tensor]:
    """(the rollouts at `indices` collated with their targets as `returns`, returns_to_abs, returns_to_res).

    turn_gae: targets and `critic_mask` only at each turn's first token (the anchors), as the PPO step has them."""
    batch = collate_trajectories([rollouts.trajectories[i] for i in indices], pad_token_id)
    index = torch.tensor(list(indices), dtype=torch.long)
    targets, to_abs, to_res = offline_critic_targets(
        config.ppo.adv_estimator, batch.rewards, batch.token_mask, rollouts.baseline[index]
    )
    critic_mask = None
    if config.ppo.adv_estimator.name == "turn_gae":
        # As in the PPO step: the turn-level critic is supervised (and scored) at each turn's first token only.
        critic_mask = turn_spans_of(batch).anchor_mask.to(batch.token_mask.dtype)
        targets = targets * critic_mask
    batch = batch.with_fields(
        returns=targets, critic_mask=critic_mask, critic_sample_mask=rollouts.critic_sample_mask[index]
    )
    return batch, to_abs, to_res


def evaluate(
    config: RunConfig, worker: ValueWorker, batch: TrainBatch, offsets: tuple[torch.Tensor, torch.Tensor]
) -> dict[str, float]:
    """Held-out value loss (masked MSE over the critic mask), explained variance (abs and residual space, pooled as
    the PPO step pools its pre-update critic/explained_var) and terminal AUC (the value at the last supervised
    token, i.e. the last response token, or the last turn's first token under turn_gae, against reward >
    critic_pretrain.success_reward_threshold)."""
    assert batch.returns is not None
    values = worker.values(batch)
    supervised = batch.critic_mask if batch.critic_mask is not None else batch.token_mask
    mask = supervised * batch.sample_mask[:, None]
    ev_abs, ev_res = pooled_explained_variance(values, batch.returns, mask, *offsets)
    successes = batch.rewards > config.critic_pretrain.success_reward_threshold
    return {
        f"{PREFIX}held_out_loss": float(masked_mean((values - batch.returns).square(), mask)),
        f"{PREFIX}held_out_explained_var": ev_abs,
        f"{PREFIX}held_out_explained_var_res": ev_res,
        f"{PREFIX}held_out_terminal_auc": terminal_auc(terminal_values(values, supervised), successes),
        f"{PREFIX}held_out_success_rate": float(successes.float().mean()),
    }


def pretraining_value_worker(setup: RunSetup) -> ValueWorker:
    """The critic of the `value` section, with a schedule over critic_pretrain.steps and one optimizer step per
    batch."""
    config = setup.config
    assert setup.paths.value is not None
    pretrain = config.critic_pretrain
    settings = builders.value_worker_settings(config, setup.paths)
    optimizer = settings.optimizer if pretrain.lr is None else settings.optimizer.model_copy(update={"lr": pretrain.lr})
    settings = dataclasses.replace(
        settings,
        optimizer=optimizer,
        scheduler_total_steps=pretrain.steps,
        train_global_batch_size=pretrain.batch_size,
        loss_settings=config.value_loss_fn.model_copy(update={"cliprange": None}),
    )
    if setup.device == "cpu":
        # As the trainer's CPU hosts do: small models gain nothing from a second OpenMP thread, and on a shared
        # machine its spin-waits cost up to ~10x.
        torch.set_num_threads(1)
    return ValueWorker(str(setup.paths.value), setup.device, settings)


def _save(worker: ValueWorker, directory: Path, source: str) -> Path:
    """Write the critic to `directory` whole: into a temporary directory first, renamed when complete."""
    temporary = directory.with_name(directory.name + ".tmp")
    shutil.rmtree(temporary, ignore_errors=True)
    worker.save(temporary)
    mark_warm_start(temporary, source)
    shutil.rmtree(directory, ignore_errors=True)
    temporary.rename(directory)
    return directory


def split_rollouts(config: RunConfig, run_dir: Path) -> tuple[Rollouts, list[int], list[int]]:
    """(the shards' rollouts, train indices, held-out indices); a ConfigError when there is nothing to split."""
    try:
        trajectories = read_shards(run_dir / CRITIC_DATA_DIR)
        # Split by prompt: a prompt the collection drew again in a later epoch must not sit on both sides.
        prompts = [tuple(t.token_ids[: t.prompt_length]) for t in trajectories]
        train, held_out = held_out_split(prompts, config.critic_pretrain.held_out_fraction, config.ppo.seed)
    except ValueError as error:
        raise ConfigError([f"critic_pretrain: {error}"]) from None
    return _rollouts(config, trajectories), train, held_out


def pretrain_critic(setup: RunSetup, run_dir: Path) -> tuple[Path, dict[str, float]]:
    """Train the value model on `run_dir`'s shards; returns (its checkpoint directory, the last evaluation)."""
    config = setup.config
    if config.value is None:
        raise ConfigError(["value: offline critic pretraining needs a value section (the critic to train)"])
    if config.value.privileged_critic.enabled:
        # A critic pretrained without the reference block would be warm-started into runs that prepend it.
        raise ConfigError(
            [
                "value.privileged_critic.enabled: true is not supported by offline critic pretraining yet "
                "(it trains on the policy's sequences without the reference block); set it to false"
            ]
        )
    rollouts, train, held_out = split_rollouts(config, run_dir)
    worker = pretraining_value_worker(setup)
    out_dir = run_dir / CRITIC_PRETRAIN_DIR
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / METRICS_FILE).unlink(missing_ok=True)  # a rerun trains from scratch: its records replace the old ones
    print(f"critic pretraining: {len(train)} rollouts to train on, {len(held_out)} held out", flush=True)
    last = _train(config, worker, rollouts, train, held_out, setup.pad_token_id, JsonlSink(out_dir / METRICS_FILE))
    steps = config.critic_pretrain.steps
    source = f"asyncppo critic pretrain: {steps} steps on {len(train)} rollouts of {run_dir / CRITIC_DATA_DIR}"
    return _save(worker, out_dir / VALUE_DIR, source), last


def _train(
    config: RunConfig,
    worker: ValueWorker,
    rollouts: Rollouts,
    train: list[int],
    held_out: list[int],
    pad_token_id: int,
    sink: JsonlSink,
) -> dict[str, float]:
    """critic_pretrain.steps optimizer steps on random batches of `train`, evaluated on `held_out` every eval_period
    steps (and at 0 and the end); every step's metrics go to `sink`, closed at the end. Returns the last evaluation."""
    pretrain = config.critic_pretrain
    held = target_batch(config, rollouts, held_out, pad_token_id) if held_out else None
    sampler = random.Random(config.ppo.seed)
    last: dict[str, float] = {}
    try:
        for step in range(pretrain.steps + 1):
            metrics: dict[str, float] = {}
            if step > 0:
                indices = sampler.sample(train, min(pretrain.batch_size, len(train)))
                batch, to_abs, to_res = target_batch(config, rollouts, indices, pad_token_id)
                trained = worker.train(batch, offsets=(to_abs, to_res))
                metrics.update({PREFIX + key.removeprefix("critic/"): value for key, value in trained.items()})
            if held is not None and (step % pretrain.eval_period == 0 or step == pretrain.steps):
                held_batch, to_abs, to_res = held
                metrics.update(evaluate(config, worker, held_batch, (to_abs, to_res)))
                last = metrics
                print(_summary(step, metrics), flush=True)
            sink.log(step, metrics)
    finally:
        sink.close()
    return last


def _summary(step: int, metrics: dict[str, float]) -> str:
    def number(key: str) -> str:
        value = metrics.get(PREFIX + key, math.nan)
        return f"{value:.4f}"

    return (
        f"step {step}: held-out loss {number('held_out_loss')}, explained var {number('held_out_explained_var')}, "
        f"terminal AUC {number('held_out_terminal_auc')}"
    )
