"""Reward processing before advantages: linear rescaling, DAPO overlong shaping, overlong filtering.

Called by the driver's step function on each batch, in this order, as NeMo-RL applies them:
scale_rewards -> shape_overlong_rewards -> overlong_filter_mask. Shapes: B samples.
"""

import torch


def scale_rewards(
    rewards: torch.Tensor, source_min: float, source_max: float, target_min: float, target_max: float
) -> torch.Tensor:
    """Clamp to [source_min, source_max], then map linearly onto [target_min, target_max].

    r' = target_min + (clamp(r) - source_min) / (source_max - source_min) * (target_max - target_min)
    """
    if source_max <= source_min:
        raise ValueError(f"reward_scaling.source_max={source_max} must exceed source_min={source_min}")
    clamped = rewards.clamp(source_min, source_max)
    return target_min + (clamped - source_min) / (source_max - source_min) * (target_max - target_min)


def shape_overlong_rewards(
    rewards: torch.Tensor,
    response_lengths: torch.Tensor,
    truncated: torch.Tensor,
    *,
    max_response_length: int | None,
    overlong_buffer_length: int | None,
    overlong_buffer_penalty: float,
    stop_properly_penalty_coef: float | None,
) -> torch.Tensor:
    """DAPO soft overlong penalty, or the stop-properly penalty when its coefficient is set.

    Soft penalty: expected = max_response_length - overlong_buffer_length;
        r' = r + min(-(L - expected) / overlong_buffer_length * overlong_buffer_penalty, 0)
    so responses shorter than `expected` are untouched and the penalty reaches -overlong_buffer_penalty at
    max_response_length. Stop-properly: truncated samples get r * stop_properly_penalty_coef.
    """
    if stop_properly_penalty_coef is not None:
        return torch.where(truncated, rewards * stop_properly_penalty_coef, rewards)
    if max_response_length is None or overlong_buffer_length is None:
        raise ValueError("overlong shaping needs max_response_length and overlong_buffer_length")
    expected = max_response_length - overlong_buffer_length
    excess = (response_lengths.to(rewards.dtype) - expected) / overlong_buffer_length
    return rewards + torch.clamp(-excess * overlong_buffer_penalty, max=0.0)


def overlong_filter_mask(sample_mask: torch.Tensor, truncated: torch.Tensor) -> torch.Tensor:
    """A new sample mask with truncated samples zeroed (they still count for baselines and whitening)."""
    return torch.where(truncated, torch.zeros_like(sample_mask), sample_mask)
