"""Front door of advantage estimation: `compute_advantages` dispatch (on the `ppo.adv_estimator` section), whitening
and metrics.

Called by the trainer once per step, after the critic forward and the old-logprob recomputation.
Shapes: B batch, S sequence positions.

    rewards, values, masks --+-- gae | turn_gae (always wrapped by the residual pieces) --+-- adv_raw/* metrics
                             +-- raw_reward (no critic) -------------------------------+-- whitening -- advantages/*

The advantage mask is token_mask x (sample_mask > 0): a masked sample never feeds the whitening statistics,
and every advantage outside the mask is 0. An all-masked batch is an error.
"""

from dataclasses import dataclass, replace

import torch

from asyncppo.algorithms import residual
from asyncppo.algorithms.gae import kl_reward_penalty, resolve_gae_lambdas, token_gae
from asyncppo.algorithms.masked import masked_mean, whiten
from asyncppo.algorithms.raw_reward import raw_reward_advantages
from asyncppo.algorithms.turns import TurnSpans, turn_gae, turn_metrics, validate_turn_spans
from asyncppo.config.losses import PolicyLossConfig
from asyncppo.config.ppo import AdvEstimatorConfig

RAW_REWARD_STD_EPS = 1e-6
"""Added to the group's reward std before raw_reward divides by it (raw_reward_normalize_std)."""


@dataclass(frozen=True)
class AdvantageResult:
    """advantages `[B, S]` (whitened if asked, 0 off the advantage mask); returns `[B, S]` and critic_mask `[B, S]`
    (token mask, or anchor mask in turn mode), both None without a critic; returns_to_abs / returns_to_res `[B]`
    offsets between residual and absolute targets; group_homogeneous `[B]` bool; metrics."""

    advantages: torch.Tensor
    returns: torch.Tensor | None
    critic_mask: torch.Tensor | None
    returns_to_abs: torch.Tensor
    returns_to_res: torch.Tensor
    group_homogeneous: torch.Tensor
    metrics: dict[str, float]


def raw_advantage_metrics(advantages: torch.Tensor, mask: torch.Tensor, normalize: bool) -> dict[str, float]:
    """adv_raw/{mean, std (biased), abs_mean, max_abs} of pre-whitening advantages `[B, S]` under `mask`, plus
    adv_raw/whiten_gain = 1 / (std + 1e-8) when normalising; empty with fewer than 2 valid tokens."""
    valid = mask.bool()
    if int(valid.sum().item()) < 2:
        return {}
    a = advantages[valid].double()
    std = a.std(correction=0).item()
    metrics = {
        "adv_raw/mean": a.mean().item(),
        "adv_raw/std": std,
        "adv_raw/abs_mean": a.abs().mean().item(),
        "adv_raw/max_abs": a.abs().max().item(),
    }
    if normalize:
        metrics["adv_raw/whiten_gain"] = 1.0 / (std + 1e-8)
    return metrics


def whiten_advantages(advantages: torch.Tensor, mask: torch.Tensor, normalize: bool) -> torch.Tensor:
    """A <- (A - mean) / sqrt(var + 1e-8) (masked mean, unbiased masked variance) if `normalize`; A <- 0 where
    mask = 0 either way. With a single valid token the variance is undefined and the result is A - mean = 0."""
    mask = mask.to(advantages.dtype)
    if not normalize:
        return advantages * mask
    if mask.sum() < 2:
        return (advantages - masked_mean(advantages, mask)) * mask
    return whiten(advantages, mask)


def _check_shapes(
    rewards: torch.Tensor,
    token_mask: torch.Tensor,
    sample_mask: torch.Tensor,
    group_ids: torch.Tensor,
    **per_token: object,
) -> None:
    if token_mask.dim() != 2:
        raise ValueError(f"token_mask must be [B, S], got {tuple(token_mask.shape)}")
    batch_size = token_mask.shape[0]
    for key, tensor in (("rewards", rewards), ("sample_mask", sample_mask), ("group_ids", group_ids)):
        if tensor.shape != (batch_size,):
            raise ValueError(f"{key} must be [B] = ({batch_size},), got {tuple(tensor.shape)}")
    for key, tensor in per_token.items():
        if isinstance(tensor, torch.Tensor) and tensor.shape != token_mask.shape:
            raise ValueError(f"{key} must be [B, S] = {tuple(token_mask.shape)}, got {tuple(tensor.shape)}")


def compute_advantages(
    settings: AdvEstimatorConfig,
    policy_loss: PolicyLossConfig | None = None,
    *,
    rewards: torch.Tensor,
    values: torch.Tensor | None,
    token_mask: torch.Tensor,
    sample_mask: torch.Tensor,
    group_ids: torch.Tensor,
    old_logprobs: torch.Tensor | None = None,
    reference_logprobs: torch.Tensor | None = None,
    turn_spans: TurnSpans | None = None,
) -> AdvantageResult:
    """Advantages, critic targets and metrics for one batch.

    rewards `[B]` (terminal R), values `[B, S]` right-shifted critic output (None for raw_reward),
    token_mask `[B, S]`, sample_mask `[B]`, group_ids `[B]` (one id per prompt group), old / reference
    logprobs `[B, S]` (needed for KL-in-reward), turn_spans (needed for turn_gae).

    `settings` is the validated `ppo.adv_estimator` section (the schema guarantees the keys its estimator
    reads); `policy_loss` is the `loss_fn` section, read for the KL-in-reward keys (None: no KL in the reward).
    """
    _check_shapes(
        rewards,
        token_mask,
        sample_mask,
        group_ids,
        values=values,
        old_logprobs=old_logprobs,
        reference_logprobs=reference_logprobs,
    )
    adv_mask = (token_mask.bool() & (sample_mask > 0).unsqueeze(1)).float()
    if adv_mask.sum() == 0:
        raise ValueError("every token is masked (token_mask x sample_mask is all 0): no advantage to estimate")
    if settings.name == "raw_reward":
        if values is not None:
            raise ValueError("raw_reward runs without a critic: pass values=None (see AdvEstimatorConfig.uses_critic)")
        raw = _raw_reward_estimate(settings, rewards, token_mask, sample_mask, group_ids)
    else:
        if values is None:
            raise ValueError(f"adv_estimator.name={settings.name!r} needs critic values")
        kl_penalty = _kl_penalty(policy_loss, old_logprobs, reference_logprobs)
        raw = _residual_critic_estimate(
            settings, rewards, values, token_mask, sample_mask, group_ids, kl_penalty, turn_spans
        )
    return _whitened(settings, raw, adv_mask)


def _raw_reward_estimate(
    settings: AdvEstimatorConfig,
    rewards: torch.Tensor,
    token_mask: torch.Tensor,
    sample_mask: torch.Tensor,
    group_ids: torch.Tensor,
) -> AdvantageResult:
    """raw_reward's advantages before whitening; no critic, so no returns and zero return-space offsets."""
    advantages = raw_reward_advantages(
        rewards,
        token_mask,
        group_ids,
        settings.raw_reward_baseline,
        settings.raw_reward_normalize_std,
        RAW_REWARD_STD_EPS,
    )
    baseline = torch.zeros_like(rewards, dtype=torch.float32)
    homogeneous, _ = residual.group_composition(rewards, group_ids, baseline, sample_mask)
    return AdvantageResult(advantages, None, None, baseline, baseline, homogeneous, {})


def _residual_critic_estimate(
    settings: AdvEstimatorConfig,
    rewards: torch.Tensor,
    values: torch.Tensor,
    token_mask: torch.Tensor,
    sample_mask: torch.Tensor,
    group_ids: torch.Tensor,
    kl_penalty: torch.Tensor | None,
    turn_spans: TurnSpans | None,
) -> AdvantageResult:
    """gae / turn_gae advantages before whitening, wrapped by the residual pieces (module docstring diagram)."""
    baseline, group_size = residual.leave_one_out_baseline(rewards, group_ids)
    homogeneous, metrics = residual.group_composition(rewards, group_ids, baseline, sample_mask)
    on = bool(settings.residual_baseline)
    if on and int(group_size.max().item()) < 2:
        raise ValueError(
            "adv_estimator.residual_baseline=true needs groups of >= 2 rollouts; every group is a singleton"
        )
    # Residual on: the inner estimator sees absolute values V~ = C + B. Off: values pass through untouched, so
    # the result is bitwise that of plain GAE.
    inner_values = values + baseline.to(values.device).unsqueeze(1) if on else values
    advantages, returns, critic_mask, inner_metrics = _critic_estimate(
        settings, rewards, inner_values, token_mask, sample_mask, kl_penalty, turn_spans
    )
    metrics |= inner_metrics
    if on:
        returns = residual.residual_returns(returns, baseline, critic_mask)
    to_abs, to_res = residual.residual_offsets(baseline, on)
    return AdvantageResult(advantages, returns, critic_mask, to_abs, to_res, homogeneous, metrics)


def _critic_estimate(
    settings: AdvEstimatorConfig,
    rewards: torch.Tensor,
    values: torch.Tensor,
    token_mask: torch.Tensor,
    sample_mask: torch.Tensor,
    kl_penalty: torch.Tensor | None,
    turn_spans: TurnSpans | None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, dict[str, float]]:
    """(advantages, returns, critic_mask, metrics) of gae or turn_gae on absolute values `[B, S]`."""
    metrics: dict[str, float] = {}
    if settings.name == "gae":
        # Required (non-null) for gae by the schema.
        assert settings.gae_lambda is not None and settings.length_adaptive_alpha is not None
        lambda_value, lambda_policy = resolve_gae_lambdas(
            token_mask,
            settings.gae_lambda,
            settings.gae_lambda_value,
            settings.gae_lambda_policy,
            settings.length_adaptive_alpha,
        )
        if isinstance(lambda_policy, torch.Tensor):
            metrics["advantages/lambda_policy_mean"] = lambda_policy.mean().item()
        advantages, returns = token_gae(
            rewards, values, token_mask, settings.gamma, lambda_value, lambda_policy, kl_penalty
        )
        return advantages, returns, token_mask, metrics
    if turn_spans is None:
        raise ValueError("adv_estimator.name='turn_gae' needs turn_spans")
    # Required (non-null) for turn_gae by the schema.
    assert settings.turn_gae_lambda_value is not None and settings.turn_gae_lambda_policy is not None
    metrics |= validate_turn_spans(turn_spans, token_mask, sample_mask)
    turns = turn_gae(
        rewards,
        values,
        turn_spans,
        token_mask,
        settings.gamma,
        settings.turn_gae_lambda_value,
        settings.turn_gae_lambda_policy,
        kl_penalty,
    )
    metrics |= turn_metrics(turns.turn_values, turns.turn_advantages, turn_spans, sample_mask)
    return turns.advantages, turns.returns, turn_spans.anchor_mask.to(token_mask.dtype), metrics


def _kl_penalty(
    policy_loss: PolicyLossConfig | None, old_logprobs: torch.Tensor | None, reference_logprobs: torch.Tensor | None
) -> torch.Tensor | None:
    if policy_loss is None or not policy_loss.uses_kl_in_reward:
        return None
    if old_logprobs is None or reference_logprobs is None:
        raise ValueError("loss_fn.use_kl_in_reward with a positive KL coefficient needs old and reference logprobs")
    return kl_reward_penalty(
        old_logprobs,
        reference_logprobs,
        policy_loss.reference_policy_kl_penalty,
        policy_loss.reference_policy_kl_type,
        policy_loss.kl_input_clamp_value,
        policy_loss.kl_output_clamp_value,
    )


def _whitened(settings: AdvEstimatorConfig, raw: AdvantageResult, adv_mask: torch.Tensor) -> AdvantageResult:
    """`raw` with its advantages whitened: pre-whitening metrics, whitening, post-whitening advantages/{mean, max,
    min} over the advantage mask."""
    normalize = bool(settings.normalize_advantages)  # required (non-null) for every estimator by the schema
    metrics = raw.metrics | raw_advantage_metrics(raw.advantages, adv_mask, normalize)
    advantages = whiten_advantages(raw.advantages, adv_mask, normalize)
    valid = advantages[adv_mask.bool()]
    metrics["advantages/mean"] = valid.mean().item()
    metrics["advantages/max"] = valid.max().item()
    metrics["advantages/min"] = valid.min().item()
    return replace(raw, advantages=advantages, metrics=metrics)
