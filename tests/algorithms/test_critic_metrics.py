"""Critic diagnostics: pooled pre-update EV, positional buckets, calibration (ECE), mixed-group EV."""

import pytest
import torch

from asyncppo.algorithms.critic_metrics import (
    calibration_ece,
    critic_diagnostics,
    pooled_explained_variance,
    position_buckets,
    positional_value_metrics,
)
from asyncppo.algorithms.microbatch import loss_normalizers
from asyncppo.algorithms.value_loss import explained_variance_from_stats, value_loss
from asyncppo.config.losses import ValueLossConfig

RETURNS = torch.tensor([[0.0, 1.0, 2.0, 5.0], [1.0, 3.0, 0.0, 4.0]])
ALL = torch.ones(2, 4)


def test_pooled_ev_is_one_for_a_perfect_predictor():
    assert pooled_explained_variance(RETURNS.clone(), RETURNS, ALL) == pytest.approx((1.0, 1.0))


def test_pooled_ev_is_zero_for_the_mean_predictor():
    # V = mean(G) everywhere: Var(G - V) = Var(G), so EV = 1 - 1 = 0.
    mean_predictor = torch.full_like(RETURNS, RETURNS.mean().item())
    assert pooled_explained_variance(mean_predictor, RETURNS, ALL) == pytest.approx((0.0, 0.0), abs=1e-6)


def test_pooled_ev_is_zero_for_a_zero_variance_target_and_for_fewer_than_two_tokens():
    constant = torch.full((2, 4), 0.7)
    assert pooled_explained_variance(torch.rand(2, 4), constant, ALL) == (0.0, 0.0)
    one_token = torch.zeros(2, 4)
    one_token[0, 1] = 1.0
    assert pooled_explained_variance(torch.rand(2, 4), RETURNS, one_token) == (0.0, 0.0)
    assert pooled_explained_variance(torch.rand(2, 4), RETURNS, torch.zeros(2, 4)) == (0.0, 0.0)


def test_pooled_ev_equals_the_sufficient_statistics_form():
    # The value loss's summed statistics and the pooled form must agree on the same (weighted) tokens.
    generator = torch.Generator().manual_seed(0)
    values, returns = torch.randn(4, 6, generator=generator), torch.randn(4, 6, generator=generator)
    to_abs, to_res = torch.randn(4, generator=generator), torch.randn(4, generator=generator)
    token_mask = (torch.rand(4, 6, generator=generator) > 0.3).float()
    token_mask[:, 0] = 0.0
    sample_mask = torch.tensor([1.0, 0.5, 0.0, 1.0])
    _, stats = value_loss(
        ValueLossConfig(scale=1.0, cliprange=None),
        values=values,
        old_values=values,
        returns=returns,
        token_mask=token_mask,
        sample_mask=sample_mask,
        global_valid_tokens=loss_normalizers(token_mask, sample_mask).valid_tokens,
        returns_to_abs=to_abs,
        returns_to_res=to_res,
    )
    from_stats = explained_variance_from_stats(stats)
    pooled = pooled_explained_variance(values, returns, token_mask * sample_mask[:, None], to_abs, to_res)
    assert pooled == pytest.approx((from_stats["ev_abs"], from_stats["ev_res"]), abs=1e-6)
    assert pooled[0] != pytest.approx(pooled[1])  # the two spaces really differ here


def test_constant_offset_moves_neither_ev_and_abs_only_spread_raises_ev_abs_only():
    values = RETURNS + torch.tensor([[0.5, -0.5, 0.2, 0.1], [-0.3, 0.4, 0.0, -0.6]])
    plain = pooled_explained_variance(values, RETURNS, ALL)
    constant = torch.full((2,), 3.0)
    assert pooled_explained_variance(values, RETURNS, ALL, constant, constant) == pytest.approx(plain)
    spread = pooled_explained_variance(values, RETURNS, ALL, returns_to_abs=torch.tensor([0.0, 10.0]))
    assert spread[0] > plain[0]
    assert spread[1] == pytest.approx(plain[1])
    perfect = pooled_explained_variance(RETURNS, RETURNS, ALL, torch.tensor([0.0, 10.0]), torch.tensor([1.0, -1.0]))
    assert perfect == pytest.approx((1.0, 1.0))


def test_ece_on_a_hand_example():
    # V     = [0.05, -0.1, 0.15, 0.12, 0.95, 1.2]   G = [0, 0, 1, 0, 1, 1]
    # bins of clamp(V, 0, 1) * 10: 0.05 -> 0, -0.1 -> 0, 0.15 -> 1, 0.12 -> 1, 0.95 -> 9, 1.2 -> 1.0 -> 9 (last bin
    # includes 1.0). Bin means use the UNclamped V:
    #   bin 0: mean V = -0.025, mean G = 0   -> 0.025
    #   bin 1: mean V = 0.135,  mean G = 0.5 -> 0.365
    #   bin 9: mean V = 1.075,  mean G = 1   -> 0.075
    # ECE = (2/6)(0.025 + 0.365 + 0.075) = 0.155. (With clamped means bin 0 would give 0.025 -> 0.0, bin 9 0.0.)
    values = torch.tensor([[0.05, -0.1, 0.15, 0.12, 0.95, 1.2]], dtype=torch.float64)
    returns = torch.tensor([[0.0, 0.0, 1.0, 0.0, 1.0, 1.0]], dtype=torch.float64)
    assert calibration_ece(values, returns, torch.ones(1, 6)) == pytest.approx(0.155)
    assert calibration_ece(values, returns, torch.zeros(1, 6)) == 0.0


# Positional example. Sequence A: prompt at 0, 6 policy tokens at 1..6 -> rank k = 0..5, rel = k/6:
#   early (3k < 6): k = 0, 1; mid (6 <= 3k < 12): k = 2, 3; late: k = 4, 5.
# Sequence B: 3 policy tokens at 2..4 -> rel = 0, 1/3, 2/3: exactly one per bucket (1/3 is mid, 2/3 is late).
POS_MASK = torch.tensor(
    [
        [0.0, 1, 1, 1, 1, 1, 1, 0],
        [0.0, 0, 1, 1, 1, 0, 0, 0],
    ]
)
POS_VALUES = torch.tensor(
    [
        [0.0, 0.2, 0.4, 0.5, 0.5, 0.9, 0.7, 0.0],
        [0.0, 0.0, 0.3, 0.6, 0.8, 0.0, 0.0, 0.0],
    ],
    dtype=torch.float64,
)
POS_RETURNS = torch.tensor(
    [
        [0.0, 0.0, 1.0, 0.0, 1.0, 1.0, 1.0, 0.0],
        [0.0, 0.0, 0.0, 1.0, 1.0, 0.0, 0.0, 0.0],
    ],
    dtype=torch.float64,
)


def test_position_buckets_split_each_sequence_in_thirds():
    expected = torch.tensor(
        [
            [-1, 0, 0, 1, 1, 2, 2, -1],
            [-1, -1, 0, 1, 2, -1, -1, -1],
        ]
    )
    assert torch.equal(position_buckets(POS_MASK), expected)


def test_positional_metrics_on_a_hand_example():
    # early: V = [.2, .4, .3], G = [0, 1, 0]
    #   abs_err = (.2 + .6 + .3)/3 = 0.366667; mean_v = 0.3; bias = (.2 - .6 + .3)/3 = -0.033333
    #   err = G - V = [-.2, .6, -.3]: mean 1/30, E[e^2] = .49/3, Var = 0.162222; Var(G) = 2/9 -> ev = 1 - 0.73 = 0.27
    #   ECE: bins 2, 4, 3 (one token each) -> mean |V - G| = 0.366667
    # mid:   V = [.5, .5, .6], G = [0, 1, 1]: abs_err = 1.4/3; mean_v = 1.6/3; bias = -0.4/3
    #   ECE: bin 5 holds (.5, 0), (.5, 1) -> gap 0; bin 6 holds (.6, 1) -> 0.4; ECE = 0.4/3
    # late:  V = [.9, .7, .8], G = [1, 1, 1]: abs_err = 0.2; bias = -0.2; mean_v = 0.8; Var(G) = 0 -> ev = 0
    metrics = positional_value_metrics(POS_VALUES, POS_RETURNS, POS_MASK)
    expected = {
        "critic/ev_early": 0.27,
        "critic/ev_res_early": 0.27,
        "critic/abs_err_early": 1.1 / 3,
        "critic/mean_v_early": 0.3,
        "critic/n_tokens_early": 3.0,
        "critic/bias_early": -0.1 / 3,
        "critic/ece_early": 1.1 / 3,
        "critic/abs_err_mid": 1.4 / 3,
        "critic/mean_v_mid": 1.6 / 3,
        "critic/bias_mid": -0.4 / 3,
        "critic/ece_mid": 0.4 / 3,
        "critic/n_tokens_mid": 3.0,
        "critic/ev_late": 0.0,
        "critic/ev_res_late": 0.0,
        "critic/abs_err_late": 0.2,
        "critic/bias_late": -0.2,
        "critic/mean_v_late": 0.8,
        "critic/n_tokens_late": 3.0,
    }
    for key, value in expected.items():
        assert metrics[key] == pytest.approx(value), key


def test_buckets_with_fewer_than_two_tokens_are_absent():
    only_b = POS_MASK.clone()
    only_b[0] = 0.0  # sequence B alone: one token per bucket
    assert positional_value_metrics(POS_VALUES, POS_RETURNS, only_b) == {}


def test_critic_diagnostics_pools_with_sample_mask_but_positions_ignore_it():
    sample_mask = torch.tensor([1.0, 0.0])
    metrics = critic_diagnostics(POS_VALUES, POS_RETURNS, POS_MASK, sample_mask)
    only_a = POS_MASK * sample_mask[:, None]
    ev_abs, ev_res = pooled_explained_variance(POS_VALUES, POS_RETURNS, only_a)
    assert (metrics["critic/explained_var"], metrics["critic/ev_res"]) == (ev_abs, ev_res)
    assert metrics["critic/n_tokens_early"] == 3.0  # sequence B still counted by position
    assert not any("mixed_group" in key for key in metrics)  # absent without group info


def test_mixed_group_ev_isolates_groups_whose_reward_varies():
    # Sequence B sits in a homogeneous group: its residual target is 0 and the critic predicts 0 exactly,
    # which inflates the pooled ev_res. Restricted to the mixed group (sequence A) the number is A's own EV.
    returns = POS_RETURNS.clone()
    values = POS_VALUES.clone()
    returns[1] = 0.0
    values[1] = 0.0
    homogeneous = torch.tensor([False, True])
    metrics = critic_diagnostics(values, returns, POS_MASK, torch.ones(2), group_homogeneous=homogeneous)
    _, ev_res_a = pooled_explained_variance(values[:1], returns[:1], POS_MASK[:1])
    assert metrics["critic/ev_res_mixed_group"] == pytest.approx(ev_res_a)
    assert metrics["critic/ev_res_mixed_group"] < metrics["critic/ev_res"]
    assert metrics["critic/n_mixed_group_tokens"] == 6.0
    # per bucket: sequence A has 2 tokens in each third
    _, ev_res_a_early = pooled_explained_variance(
        values[:1], returns[:1], POS_MASK[:1] * (position_buckets(POS_MASK[:1]) == 0)
    )
    assert metrics["critic/ev_res_mixed_group_early"] == pytest.approx(ev_res_a_early)
    assert {"critic/ev_res_mixed_group_mid", "critic/ev_res_mixed_group_late"} <= set(metrics)
