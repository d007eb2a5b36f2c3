"""The one PPO training step, shared by sync and async runs: batch in, updated models and metrics out.

    1. reward processing (scaling, overlong shaping and filtering); turn spans when turn_gae
    2. [privileged critic] the critic layout: each row = its reference-block prefix + the verbatim tokens
    3. critic values before any update; [privileged] scored in the critic layout, moved back to the policy layout
    4. old (+ reference) logprobs, mismatch metrics and sequence masking (one PPO epoch over one global batch: the
       policy pass of 7 gives the old logprobs from its own forward, and the mismatch metrics follow it)
    5. advantages and critic targets, pre-update critic diagnostics (policy layout)
    6. critic passes (critic_ppo_epochs); [privileged] returns, critic mask and every [B, S] field moved to the
       critic layout, the critic-layout values kept for value clipping, [B] offsets and masks unchanged
    7. policy passes (ppo_epochs, from step W on) on the policy layout, which is also what StepOutput carries

Called by the driver loop (`trainer/loop.py`) once per step. It talks to the models only through the two small
protocols of the worker facade (`PolicyModel`, `ValueModel`), so it runs the same on Ray worker groups and on
in-process workers (tests). The privileged
critic's prefixes are built by the driver from the step's trajectories (it holds the tokenizer) and come in as
`critic_prefixes` (`trainer/privileged_critic.py`); the policy never sees them.
"""

import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TypeVar

import torch

from asyncppo.algorithms.advantages import compute_advantages
from asyncppo.algorithms.critic_metrics import critic_diagnostics
from asyncppo.algorithms.microbatch import reduce_metrics_by_key
from asyncppo.algorithms.mismatch import mask_sequences_by_logprob_error, token_mismatch_metrics
from asyncppo.algorithms.privilege import PrefixedLayout
from asyncppo.algorithms.residual import homogeneous_group_sample_mask
from asyncppo.algorithms.reward_processing import overlong_filter_mask, scale_rewards, shape_overlong_rewards
from asyncppo.algorithms.turns import TurnSpans, build_turn_spans, validate_turn_spans
from asyncppo.config.losses import PolicyLossConfig
from asyncppo.config.ppo import AdvEstimatorConfig, RewardScalingConfig, RewardShapingConfig
from asyncppo.trainer.privileged_critic import CriticPrefixes, critic_batch, critic_layout
from asyncppo.types import TrainBatch, Trajectory
from asyncppo.workers.groups import PolicyModel, ValueModel


@dataclass(frozen=True)
class StepSettings:
    """Everything the step needs from the config, as plain values (built by trainer/builders.py)."""

    advantage: AdvEstimatorConfig
    policy_loss: PolicyLossConfig
    """loss_fn: its KL-in-reward keys feed the advantages, its reference KL type the mismatch metrics."""
    ppo_epochs: int
    critic_ppo_epochs: int
    policy_training_start_step: int
    log_post_update_critic_metrics: bool
    homogeneous_group_weight: float
    seq_logprob_error_threshold: float | None
    overlong_filtering: bool
    need_reference_logprobs: bool
    reward_scaling: RewardScalingConfig | None = None
    """ppo.reward_scaling when enabled, else None."""
    reward_shaping: RewardShapingConfig | None = None
    """ppo.reward_shaping when enabled, else None."""
    privileged_critic: bool = False
    """value.privileged_critic.enabled: every step must then come with critic_prefixes."""
    old_logprobs_from_training: bool = False
    """Take the old logprobs from the policy pass's own forward instead of a scoring pass before it (see
    `builders.old_logprobs_from_training` for when that is exact); steps whose batch is more than one of the
    policy's global batches still score them first."""
    policy_global_batch_size: int | None = None
    """model.train_global_batch_size (null = the whole step batch)."""

    def one_global_batch(self, num_samples: int) -> bool:
        """The policy's pass over `num_samples` samples takes exactly one optimizer step."""
        return self.policy_global_batch_size is None or num_samples <= self.policy_global_batch_size


@dataclass(frozen=True)
class StepOutput:
    """The batch with every field the step filled, the step's metrics, and whether the policy changed."""

    batch: TrainBatch
    metrics: dict[str, float]
    policy_trained: bool


def _response_lengths(batch: TrainBatch) -> torch.Tensor:
    return batch.token_mask.sum(dim=1)


def training_rewards(
    settings: StepSettings, rewards: torch.Tensor, response_lengths: torch.Tensor, truncated: torch.Tensor
) -> torch.Tensor:
    """The rewards the step trains on: scaling, then overlong shaping, in the order NeMo-RL applies them."""
    if settings.reward_scaling is not None:
        rewards = scale_rewards(rewards, settings.reward_scaling)
    if settings.reward_shaping is not None:
        rewards = shape_overlong_rewards(rewards, response_lengths, truncated, settings.reward_shaping)
    return rewards


def group_training_rewards(settings: StepSettings, group: Sequence[Trajectory]) -> list[float]:
    """`training_rewards` of one group's trajectories, computed as on the collated batch (float32 rewards,
    response length = generated tokens), so dynamic sampling filters on exactly what the step trains on."""
    rewards = torch.tensor([trajectory.reward for trajectory in group], dtype=torch.float32)
    lengths = torch.tensor([sum(trajectory.loss_mask) for trajectory in group], dtype=torch.float32)
    truncated = torch.tensor([trajectory.truncated for trajectory in group], dtype=torch.bool)
    return [float(reward) for reward in training_rewards(settings, rewards, lengths, truncated).float()]


def process_rewards(settings: StepSettings, batch: TrainBatch) -> TrainBatch:
    """Scaling, then overlong shaping, then overlong filtering, in the order NeMo-RL applies them."""
    rewards = training_rewards(settings, batch.rewards, _response_lengths(batch), batch.truncated)
    sample_mask = batch.sample_mask
    if settings.overlong_filtering:
        sample_mask = overlong_filter_mask(sample_mask, batch.truncated)
    return batch.with_fields(rewards=rewards.float(), sample_mask=sample_mask)


def rollout_metrics(batch: TrainBatch) -> dict[str, float]:
    """train/* statistics of the raw rollouts, before any reward processing."""
    lengths = _response_lengths(batch)
    return {
        "train/reward_mean": batch.rewards.mean().item(),
        "train/reward_std": batch.rewards.std(correction=0).item(),
        "train/response_length_mean": lengths.mean().item(),
        "train/response_length_max": lengths.max().item(),
        "train/truncated_frac": batch.truncated.float().mean().item(),
        "train/num_samples": float(len(batch)),
        "train/sequence_length_mean": batch.attention_mask.sum(dim=1).float().mean().item(),
    }


def turn_spans_of(batch: TrainBatch) -> TurnSpans:
    """Turn spans of the batch, validated against its token mask (before any model work)."""
    logs = [[(span.role, span.num_tokens) for span in log] for log in batch.message_logs]
    spans = build_turn_spans(logs, batch.seq_len)
    validate_turn_spans(spans, batch.token_mask, batch.sample_mask)
    return spans


T = TypeVar("T")


def _timed(timings: dict[str, float], key: str, action: Callable[[], T]) -> T:
    start = time.perf_counter()
    result = action()
    timings[f"timing/{key}"] = timings.get(f"timing/{key}", 0.0) + time.perf_counter() - start
    return result


TOKEN_COUNTER_SUFFIXES = ("tokens_computed", "tokens_real")
"""Worker metrics that count tokens (`policy/tokens_real`, `critic/scored_tokens_computed`, ...): summed over passes."""


def average_metrics(passes: Iterable[Mapping[str, float]]) -> dict[str, float]:
    """Mean over passes per key (min / max keys take the extreme), so multi-epoch steps report one number; token
    counters are summed instead, so they count the whole step (trainer/perf.py's padding ratio reads them)."""
    passes = list(passes)
    reduced = reduce_metrics_by_key(passes, lambda values: sum(values) / len(values))
    for key in reduced:
        if key.endswith(TOKEN_COUNTER_SUFFIXES):
            reduced[key] = sum(entry[key] for entry in passes if key in entry)
    return reduced


def ppo_step(
    settings: StepSettings,
    policy: PolicyModel,
    value: ValueModel | None,
    batch: TrainBatch,
    step: int,
    *,
    critic_prefixes: CriticPrefixes | None = None,
) -> StepOutput:
    """One PPO step on `batch` at training step `step` (0-based). See the module docstring for the order.

    Longer than 60 lines on purpose: the step's whole order (scoring, rewards, advantages, critic then policy
    updates) reads top to bottom in one place; each stage it calls is a function of its own.

    critic_prefixes: the privileged critic's per-row prefixes (required exactly when settings.privileged_critic).
    """
    timings: dict[str, float] = {}
    metrics = rollout_metrics(batch)
    batch = process_rewards(settings, batch)
    metrics["train/processed_reward_mean"] = batch.rewards.mean().item()
    spans = turn_spans_of(batch) if settings.advantage.name == "turn_gae" else None
    layout = _privileged_layout(settings, value, batch, critic_prefixes)
    if critic_prefixes is not None:
        metrics.update(critic_prefixes.metrics)

    values = critic_values = None
    if value is not None:
        scored = batch if layout is None else critic_batch(batch, layout)
        critic_values = _timed(timings, "values", lambda: value.values(scored))
        values = critic_values if layout is None else layout.to_policy(critic_values)
    policy_trained = step >= settings.policy_training_start_step
    # One PPO epoch over one global batch: the training pass's own first forward gives the old logprobs.
    fused = settings.old_logprobs_from_training and policy_trained and settings.one_global_batch(len(batch))
    old_logprobs = None if fused else _timed(timings, "logprobs", lambda: policy.logprobs(batch))
    reference_logprobs = None
    if settings.need_reference_logprobs:
        reference_logprobs = _timed(timings, "reference_logprobs", lambda: policy.reference_logprobs(batch))

    sample_mask = batch.sample_mask
    if old_logprobs is not None:
        sample_mask = _mismatch(settings, batch, old_logprobs, metrics)

    result = compute_advantages(
        settings.advantage,
        settings.policy_loss,
        rewards=batch.rewards,
        values=values,
        token_mask=batch.token_mask,
        sample_mask=sample_mask,
        group_ids=batch.group_ids,
        old_logprobs=old_logprobs,
        reference_logprobs=reference_logprobs,
        turn_spans=spans,
    )
    metrics.update(result.metrics)
    critic_sample_mask = homogeneous_group_sample_mask(
        sample_mask, result.group_homogeneous, settings.homogeneous_group_weight
    )
    batch = batch.with_fields(
        sample_mask=sample_mask,
        old_logprobs=old_logprobs,
        reference_logprobs=reference_logprobs,
        values=values,
        advantages=result.advantages,
        returns=result.returns,
        critic_mask=result.critic_mask,
        critic_sample_mask=critic_sample_mask,
    )

    if value is not None:
        assert values is not None and result.returns is not None and result.critic_mask is not None
        metrics.update(
            critic_diagnostics(
                values,
                result.returns,
                result.critic_mask,
                sample_mask,
                result.returns_to_abs,
                result.returns_to_res,
                result.group_homogeneous,
            )
        )
        # Privileged: the critic trains on its own layout, with the values it scored there (for value clipping).
        value_batch = batch if layout is None else critic_batch(batch, layout).with_fields(values=critic_values)
        offsets = (result.returns_to_abs, result.returns_to_res)
        metrics.update(_train_critic(settings, value, value_batch, offsets, timings))

    if fused:
        passes, old_logprobs = _timed(timings, "policy_train", lambda: policy.train_on_policy(batch))
        batch = batch.with_fields(old_logprobs=old_logprobs)
        _mismatch(settings, batch, old_logprobs, metrics)  # no sequence masking in fused steps: reported only
        metrics.update(average_metrics([passes]))
    elif policy_trained:
        passes = [_timed(timings, "policy_train", lambda: policy.train(batch)) for _ in range(settings.ppo_epochs)]
        metrics.update(average_metrics(passes))
    metrics["train/policy_trained"] = float(policy_trained)
    metrics.update(timings)
    return StepOutput(batch=batch, metrics=metrics, policy_trained=policy_trained)


def _mismatch(
    settings: StepSettings, batch: TrainBatch, old_logprobs: torch.Tensor, metrics: dict[str, float]
) -> torch.Tensor:
    """Train/inference mismatch metrics (into `metrics`) and the sample mask after sequence masking by them."""
    loss_mask = batch.token_mask * batch.sample_mask[:, None]
    num_valid = float(loss_mask.sum().item())
    if num_valid > 0:
        mismatch = token_mismatch_metrics(
            old_logprobs, batch.generation_logprobs, loss_mask, num_valid, settings.policy_loss.reference_policy_kl_type
        )
        metrics.update({f"mismatch/{key}": value_ for key, value_ in mismatch.items()})
    sample_mask, seq_metrics = mask_sequences_by_logprob_error(
        settings.seq_logprob_error_threshold,
        old_logprobs=old_logprobs,
        generation_logprobs=batch.generation_logprobs,
        token_mask=batch.token_mask,
        sample_mask=batch.sample_mask,
        rewards=batch.rewards,
    )
    metrics.update({f"mismatch/{key}": value_ for key, value_ in seq_metrics.items()})
    return sample_mask


def _privileged_layout(
    settings: StepSettings, value: ValueModel | None, batch: TrainBatch, critic_prefixes: CriticPrefixes | None
) -> PrefixedLayout | None:
    """The critic layout when the privileged critic is on; ValueError when the prefixes and the settings disagree."""
    if settings.privileged_critic != (critic_prefixes is not None):
        state = "on" if settings.privileged_critic else "off"
        raise ValueError(
            f"the privileged critic is {state} but critic_prefixes {'was not' if state == 'on' else 'was'} given"
        )
    if critic_prefixes is None:
        return None
    if value is None:
        raise ValueError("critic_prefixes were given but the step has no value model")
    if len(critic_prefixes.token_ids) != len(batch):
        raise ValueError(f"{len(critic_prefixes.token_ids)} critic prefixes for a batch of {len(batch)} rows")
    return critic_layout(batch, critic_prefixes)


EV_PREFIX = "critic/explained_var"


def _train_critic(
    settings: StepSettings,
    value: ValueModel,
    batch: TrainBatch,
    offsets: tuple[torch.Tensor, torch.Tensor],
    timings: dict[str, float],
) -> dict[str, float]:
    """critic_ppo_epochs passes over the batch, then the optional post-update re-score.

    All critic passes run before the policy passes: the surplus (critic_ppo_epochs - ppo_epochs) first, then
    the shared ones; the policy never reads critic outputs after this step's values, so grouping them changes
    nothing for the policy and saves a model swap per epoch on shared devices.
    """
    passes = [
        _timed(timings, "critic_train", lambda: value.train(batch, offsets=offsets))
        for _ in range(settings.critic_ppo_epochs)
    ]
    # The loss-derived EV comes from a critic that already fit this batch: it is reported for the last pass
    # (how well the critic fits after all its passes), under its own name so the pre-update pooled EV stays
    # the headline critic/explained_var. Losses, norms and the rest are means over the passes.
    metrics = {key: value_ for key, value_ in average_metrics(passes).items() if not key.startswith(EV_PREFIX)}
    metrics.update(
        {
            key.replace(EV_PREFIX, "critic/explained_var_last_pass"): value_
            for key, value_ in passes[-1].items()
            if key.startswith(EV_PREFIX)
        }
    )
    if settings.log_post_update_critic_metrics:
        rescored = value.evaluate(batch, offsets=offsets)
        for key in ("critic/explained_var", "critic/loss"):
            if key in rescored:
                metrics[f"{key}_post_update"] = rescored[key]
    return metrics
