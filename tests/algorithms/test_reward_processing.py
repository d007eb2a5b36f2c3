"""Reward scaling, overlong shaping and overlong filtering on hand-computed cases."""

import torch

from asyncppo.algorithms.reward_processing import overlong_filter_mask, scale_rewards, shape_overlong_rewards
from asyncppo.config.ppo import RewardScalingConfig, RewardShapingConfig


def test_scaling_clamps_then_maps_linearly():
    # [0, 1] -> [-1, 1]: 0 -> -1, 0.25 -> -0.5, 1 -> 1; 2 clamps to 1 and -3 clamps to 0.
    rewards = torch.tensor([0.0, 0.25, 1.0, 2.0, -3.0])
    scaling = RewardScalingConfig(enabled=True, source_min=0.0, source_max=1.0, target_min=-1.0, target_max=1.0)
    scaled = scale_rewards(rewards, scaling)
    torch.testing.assert_close(scaled, torch.tensor([-1.0, -0.5, 1.0, 1.0, -1.0]))


def test_soft_overlong_penalty_starts_after_the_expected_length():
    # max 10, buffer 4 -> expected 6. Lengths 5, 6, 8, 10: excess -0.25, 0, 0.5, 1 -> penalty 0, 0, -0.5, -1 (x1.0).
    shaped = shape_overlong_rewards(
        torch.ones(4),
        torch.tensor([5, 6, 8, 10]),
        torch.tensor([False, False, False, True]),
        RewardShapingConfig(
            enabled=True, max_response_length=10, overlong_buffer_length=4, overlong_buffer_penalty=1.0
        ),
    )
    torch.testing.assert_close(shaped, torch.tensor([1.0, 1.0, 0.5, 0.0]))


def test_stop_properly_penalty_scales_only_truncated_samples():
    shaped = shape_overlong_rewards(
        torch.tensor([1.0, 1.0]),
        torch.tensor([3, 9]),
        torch.tensor([False, True]),
        RewardShapingConfig(enabled=True, stop_properly_penalty_coef=0.5),
    )
    torch.testing.assert_close(shaped, torch.tensor([1.0, 0.5]))


def test_overlong_filter_zeroes_truncated_samples_in_a_new_mask():
    sample_mask = torch.tensor([1.0, 1.0, 0.5])
    filtered = overlong_filter_mask(sample_mask, torch.tensor([False, True, False]))
    torch.testing.assert_close(filtered, torch.tensor([1.0, 0.0, 0.5]))
    torch.testing.assert_close(sample_mask, torch.tensor([1.0, 1.0, 0.5]))  # input untouched
