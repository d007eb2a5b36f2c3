"""Reward processing before advantages: linear rescaling, DAPO overlong shaping, overlong filtering.

Called by the driver's step function on each batch, in this order, as NeMo-RL applies them:
scale_rewards -> shape_overlong_rewards -> overlong_filter_mask. Shapes: B samples.
"""

import torch

from asyncppo.config.ppo import RewardScalingConfig, RewardShapingConfig


def scale_rewards(rewards: torch.Tensor, scaling: RewardScalingConfig) -> torch.Tensor:
    """Clamp to [source_min, source_max], then map linearly onto [target_min, target_max] (the schema checks
    source_max > source_min).

    r' = target_min + (clamp(r) - source_min) / (source_max - source_min) * (target_max - target_min)
    """
    source_min, source_max = scaling.source_min, scaling.source_max
    clamped = rewards.clamp(source_min, source_max)
    return scaling.target_min + (clamped - source_min) / (source_max - source_min) * (
        scaling.target_max - scaling.target_min
    )


def shape_overlong_rewards(
    rewards: torch.Tensor, response_lengths: torch.Tensor, truncated: torch.Tensor, shaping: RewardShapingConfig
) -> torch.Tensor:
    """DAPO soft overlong penalty, or the stop-properly penalty when its coefficient is set.

    Soft penalty: expected = max_response_length - overlong_buffer_length;
        r' = r + min(-(L - expected) / overlong_buffer_length * overlong_buffer_penalty, 0)
    so responses shorter than `expected` are untouched and the penalty reaches -overlong_buffer_penalty at
    max_response_length. Stop-properly: truncated samples get r * stop_properly_penalty_coef.
    """
    if shaping.stop_properly_penalty_coef is not None:
        return torch.where(truncated, rewards * shaping.stop_properly_penalty_coef, rewards)
    max_response_length, overlong_buffer_length = shaping.max_response_length, shaping.overlong_buffer_length
    # Required by the schema when the section is enabled and stop_properly_penalty_coef is null.
    assert max_response_length is not None and overlong_buffer_length is not None
    expected = max_response_length - overlong_buffer_length
    excess = (response_lengths.to(rewards.dtype) - expected) / overlong_buffer_length
    return rewards + torch.clamp(-excess * shaping.overlong_buffer_penalty, max=0.0)


def overlong_filter_mask(sample_mask: torch.Tensor, truncated: torch.Tensor) -> torch.Tensor:
    """A new sample mask with truncated samples zeroed (they still count for baselines and whitening)."""
    return torch.where(truncated, torch.zeros_like(sample_mask), sample_mask)
