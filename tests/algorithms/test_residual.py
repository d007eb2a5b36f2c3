"""Residual baseline: leave-one-out arithmetic, the change of variables V~ = C + B, bitwise identity when off,
group composition metrics, the homogeneous-group critic mask, and turn mode."""

from typing import Any

import pytest
import torch

from asyncppo.algorithms.advantages import compute_advantages, whiten_advantages
from asyncppo.algorithms.gae import token_gae
from asyncppo.algorithms.residual import (
    dense_groups,
    group_composition,
    group_ids_from_prompts,
    homogeneous_group_sample_mask,
    leave_one_out_baseline,
)
from asyncppo.algorithms.turns import build_turn_spans
from asyncppo.config.ppo import AdvEstimatorConfig
from ppo_settings import gae, turn_gae


def _settings(residual_baseline: bool, gae_lambda: float = 1.0, normalize: bool = False) -> AdvEstimatorConfig:
    return gae(residual_baseline=residual_baseline, gae_lambda=gae_lambda, normalize_advantages=normalize)


def _batch(rewards: list[float], group_ids: list[int], seq: int = 5, seed: int = 0) -> dict[str, Any]:
    """A prompt token, then ragged responses (at least 2 tokens), random critic output C."""
    generator = torch.Generator().manual_seed(seed)
    batch = len(rewards)
    mask = torch.zeros(batch, seq)
    for row in range(batch):
        mask[row, 1 : 3 + row % (seq - 2)] = 1
    return {
        "rewards": torch.tensor(rewards),
        "values": torch.randn(batch, seq, generator=generator) * 0.1,
        "token_mask": mask,
        "sample_mask": torch.ones(batch),
        "group_ids": torch.tensor(group_ids),
    }


def test_leave_one_out_arithmetic_gives_zero_sum_targets_constant_along_tokens() -> None:
    # R = [1, 0, 0, 0] in one group: B = [(0+0+0)/3, (1+0+0)/3, ...] = [0, 1/3, 1/3, 1/3].
    # With C = 0, gamma = lambda = 1, G_t = R (absolute), so Y = R - B = [1, -1/3, -1/3, -1/3] on every token.
    batch = _batch([1.0, 0.0, 0.0, 0.0], [0, 0, 0, 0])
    batch["values"] = torch.zeros_like(batch["values"])
    result = compute_advantages(_settings(True), **batch)
    assert result.returns is not None
    mask = batch["token_mask"]
    for row, target in enumerate([1.0, -1 / 3, -1 / 3, -1 / 3]):
        torch.testing.assert_close(result.returns[row][mask[row].bool()], torch.full((int(mask[row].sum()),), target))
        assert bool((result.returns[row][~mask[row].bool()] == 0).all())
    per_sample = result.returns[:, 1]
    assert abs(per_sample.sum().item()) < 1e-6
    torch.testing.assert_close(result.returns_to_abs, torch.tensor([0.0, 1 / 3, 1 / 3, 1 / 3]))
    assert torch.equal(result.returns_to_res, torch.zeros(4))


def test_singleton_group_gets_its_own_reward_as_baseline() -> None:
    # Group 0 = [1, 0] -> B = [0, 1]; group 1 = [0.7] alone -> B = R = 0.7 (target 0).
    baseline, size = leave_one_out_baseline(torch.tensor([1.0, 0.0, 0.7]), torch.tensor([5, 5, 9]))
    torch.testing.assert_close(baseline, torch.tensor([0.0, 1.0, 0.7]))
    assert baseline.dtype == torch.float32
    assert size.tolist() == [2, 2, 1]


def test_homogeneous_group_targets_are_zero() -> None:
    # All-pass group: B_i = 1 = R_i; at gamma = lambda = 1, G_t = R, so Y = R - B = 0 whatever C is.
    batch = _batch([1.0, 1.0, 1.0, 0.0, 1.0], [0, 0, 0, 1, 1])
    result = compute_advantages(_settings(True), **batch)
    assert result.returns is not None
    assert torch.allclose(result.returns[:3], torch.zeros(3, 5), atol=1e-6)
    assert result.group_homogeneous.tolist() == [True, True, True, False, False]


def test_residual_advantages_equal_absolute_gae_on_critic_plus_baseline() -> None:
    batch = _batch([1.0, 0.0, 0.5, 1.0, 0.0, 0.0], [0, 0, 0, 1, 1, 1])
    settings = _settings(True, gae_lambda=0.9, normalize=True)
    result = compute_advantages(settings, **batch)
    baseline, _ = leave_one_out_baseline(batch["rewards"], batch["group_ids"])
    shifted = batch["values"] + baseline.unsqueeze(1)
    mask = batch["token_mask"]
    absolute_a, absolute_g = token_gae(batch["rewards"], shifted, mask, 1.0, 0.9, 0.9)
    torch.testing.assert_close(result.advantages, whiten_advantages(absolute_a, mask, True))
    assert result.returns is not None
    torch.testing.assert_close(result.returns, absolute_g - baseline.unsqueeze(1) * mask)


def test_lambda_one_telescopes_to_reward_minus_baseline_minus_critic() -> None:
    # gamma = lambda = 1 on V~ = C + B: A_t = R - V~_t = R - B - C_t on every response token.
    batch = _batch([1.0, 0.0, 0.0, 1.0], [0, 0, 1, 1])
    result = compute_advantages(_settings(True), **batch)
    baseline = torch.tensor([0.0, 1.0, 1.0, 0.0])
    expected = (batch["rewards"].unsqueeze(1) - baseline.unsqueeze(1) - batch["values"]) * batch["token_mask"]
    torch.testing.assert_close(result.advantages, expected)


def test_residual_off_is_bitwise_identical_to_plain_gae_and_still_exports_offsets() -> None:
    batch = _batch([1.0, 0.0, 0.5, 1.0], [0, 0, 1, 1])
    result = compute_advantages(_settings(False, gae_lambda=0.95, normalize=True), **batch)
    plain_a, plain_g = token_gae(batch["rewards"], batch["values"], batch["token_mask"], 1.0, 0.95, 0.95)
    assert torch.equal(result.advantages, whiten_advantages(plain_a, batch["token_mask"], True))
    assert result.returns is not None and torch.equal(result.returns, plain_g)
    # B = [0, 1, 1, 0.5]: off means targets are absolute, to_abs = 0 and to_res = -B.
    assert torch.equal(result.returns_to_abs, torch.zeros(4))
    torch.testing.assert_close(result.returns_to_res, -torch.tensor([0.0, 1.0, 1.0, 0.5]))
    assert "residual/b_loo_mean" in result.metrics


def test_residual_rejects_single_rollout_groups() -> None:
    # gamma == 1 and num_generations_per_prompt >= 2 are config rules (tests/config/test_rules.py).
    batch = _batch([1.0, 0.0], [0, 1])
    with pytest.raises(ValueError, match="singleton"):
        compute_advantages(_settings(True), **batch)
    compute_advantages(_settings(False), **batch)  # off: singletons are allowed, only counted


def test_group_composition_metrics_three_groups() -> None:
    # Groups: mixed [1, 0], all-fail [0, 0], all-pass [1, 1] -> 1/3 each.
    # B = [0, 1, 0, 0, 1, 1]: mean 0.5, std 0.5. R - B = [1, -1, 0, 0, 0, 0]: biased var 2/6.
    rewards = torch.tensor([1.0, 0.0, 0.0, 0.0, 1.0, 1.0])
    group_ids = torch.tensor([0, 0, 1, 1, 2, 2])
    baseline, _ = leave_one_out_baseline(rewards, group_ids)
    sample_mask = torch.tensor([1.0, 0.0, 1.0, 1.0, 1.0, 1.0])
    homogeneous, metrics = group_composition(rewards, group_ids, baseline, sample_mask)
    assert homogeneous.tolist() == [False, False, True, True, True, True]
    expected = {
        "residual/b_loo_mean": 0.5,
        "residual/b_loo_std": 0.5,
        "residual/target_var": 1 / 3,
        "residual/frac_groups_mixed": 1 / 3,
        "residual/frac_groups_all_fail": 1 / 3,
        "residual/frac_groups_all_pass": 1 / 3,
        "residual/n_singleton_groups": 0.0,
        "residual/group_size_min": 2.0,
        "residual/group_size_max": 2.0,
        "residual/frac_traj_sample_masked": 1 / 6,
    }
    assert metrics.keys() == expected.keys()
    for key, value in expected.items():
        assert metrics[key] == pytest.approx(value), key


def test_singleton_groups_are_counted() -> None:
    rewards = torch.tensor([1.0, 0.0, 0.3])
    group_ids = torch.tensor([0, 0, 1])
    _, metrics = group_composition(rewards, group_ids, leave_one_out_baseline(rewards, group_ids)[0], torch.ones(3))
    assert metrics["residual/n_singleton_groups"] == 1.0
    assert metrics["residual/group_size_min"] == 1.0 and metrics["residual/group_size_max"] == 2.0


@pytest.mark.parametrize(("scale", "shift"), [(1.0, 0.0), (2.0, -1.0), (1000.0, 0.3), (1e-3, 0.0)])
def test_homogeneity_survives_reward_scaling(scale: float, shift: float) -> None:
    rewards = torch.tensor([1.0, 0.0, 0.0, 0.0, 1.0, 1.0]) * scale + shift
    group_ids = torch.tensor([0, 0, 1, 1, 2, 2])
    homogeneous, metrics = group_composition(rewards, group_ids, torch.zeros(6), torch.ones(6))
    assert homogeneous.tolist() == [False, False, True, True, True, True]
    assert metrics["residual/frac_groups_all_fail"] == pytest.approx(1 / 3)
    assert metrics["residual/frac_groups_all_pass"] == pytest.approx(1 / 3)


def test_homogeneity_with_fractional_rewards() -> None:
    # [0.3, 0.3] sits at the batch min (all fail), [0.9, 0.9] at the max (all pass), [0.6, 0.6] is homogeneous
    # but neither, [0.3, 0.9] is mixed.
    rewards = torch.tensor([0.3, 0.3, 0.9, 0.9, 0.6, 0.6, 0.3, 0.9])
    group_ids = torch.tensor([0, 0, 1, 1, 2, 2, 3, 3])
    homogeneous, metrics = group_composition(rewards, group_ids, torch.zeros(8), torch.ones(8))
    assert homogeneous.tolist() == [True] * 6 + [False] * 2
    assert metrics["residual/frac_groups_mixed"] == 0.25
    assert metrics["residual/frac_groups_all_fail"] == 0.25
    assert metrics["residual/frac_groups_all_pass"] == 0.25


def test_sample_mask_does_not_remove_a_rollout_from_its_siblings_baselines() -> None:
    batch = _batch([1.0, 0.0, 0.0, 0.0], [0, 0, 0, 0])
    batch["sample_mask"] = torch.tensor([0.0, 1.0, 1.0, 1.0])
    result = compute_advantages(_settings(True), **batch)
    torch.testing.assert_close(result.returns_to_abs, torch.tensor([0.0, 1 / 3, 1 / 3, 1 / 3]))
    assert result.metrics["residual/frac_traj_sample_masked"] == 0.25


def test_homogeneous_group_sample_mask_downweights_only_homogeneous_groups() -> None:
    # mask * (1 - h (1 - w)) with w = 0.25: homogeneous rows scale by 0.25, the others stay.
    sample_mask = torch.tensor([1.0, 1.0, 0.0, 1.0])
    homogeneous = torch.tensor([True, False, True, True])
    weighted = homogeneous_group_sample_mask(sample_mask, homogeneous, 0.25)
    assert weighted.tolist() == [0.25, 1.0, 0.0, 0.25]
    assert sample_mask.tolist() == [1.0, 1.0, 0.0, 1.0]  # input untouched
    assert torch.equal(homogeneous_group_sample_mask(sample_mask, homogeneous, 1.0), sample_mask)


def test_homogeneous_group_sample_mask_rejects_bad_input() -> None:
    sample_mask = torch.ones(2)
    with pytest.raises(ValueError, match="must be >= 0"):
        homogeneous_group_sample_mask(sample_mask, torch.tensor([True, False]), -0.5)
    with pytest.raises(ValueError, match="needs group_homogeneous"):
        homogeneous_group_sample_mask(sample_mask, None, 0.5)
    with pytest.raises(ValueError, match="does not match"):
        homogeneous_group_sample_mask(sample_mask, torch.tensor([True, False, True]), 0.5)


def test_turn_mode_does_not_leak_the_baseline_off_anchor() -> None:
    logs = [[("user", 2), ("assistant", 2), ("tool", 1), ("assistant", 2)], [("user", 3), ("assistant", 3)]]
    spans = build_turn_spans(logs, seq_len=8)
    settings = turn_gae(residual_baseline=True)
    values = torch.full((2, 8), 0.25)
    result = compute_advantages(
        settings,
        rewards=torch.tensor([1.0, 0.0]),
        values=values,
        token_mask=(spans.turn_index >= 0).float(),
        sample_mask=torch.ones(2),
        group_ids=torch.tensor([0, 0]),
        turn_spans=spans,
    )
    # B = [0, 1]; at lambda = 1 G_k = R, so Y = R - B = [1, -1] at the anchors and exactly 0 elsewhere.
    expected = torch.zeros(2, 8)
    expected[0, [2, 5]] = 1.0
    expected[1, 3] = -1.0
    assert result.returns is not None
    assert torch.equal(result.returns, expected)
    assert result.critic_mask is not None and torch.equal(result.critic_mask.bool(), spans.anchor_mask)


def test_group_ids_from_prompts_merge_identical_padded_rows_in_order_of_first_appearance() -> None:
    prompts = torch.tensor([[3, 4, 5], [1, 2, 0], [3, 4, 5], [1, 2, 0], [1, 2, 7]])
    assert group_ids_from_prompts(prompts).tolist() == [0, 1, 0, 1, 2]


def test_dense_groups_handle_arbitrary_ids() -> None:
    inverse, counts = dense_groups(torch.tensor([42, -3, 42, 7]))
    assert inverse.tolist() == [2, 0, 2, 1]
    assert counts.tolist() == [1, 1, 2]
