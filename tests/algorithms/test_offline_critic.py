"""Offline critic pretraining math: terminal AUC (hand-computed, ties), the held-out split by prompt group,
reward-to-go targets (gamma, residual baseline, estimator rules) and the terminal value's position."""

import math

import pytest
import torch

from asyncppo.algorithms.offline_critic import (
    held_out_split,
    offline_critic_targets,
    reward_to_go_targets,
    terminal_auc,
    terminal_values,
)
from asyncppo.algorithms.residual import leave_one_out_baseline
from asyncppo.config.ppo import AdvEstimatorConfig
from ppo_settings import gae, turn_gae


def test_terminal_auc_counts_every_positive_negative_pair():
    # Positives 0.9, 0.4; negatives 0.5, 0.1: pairs (0.9>0.5, 0.9>0.1, 0.4<0.5, 0.4>0.1) -> 3 of 4.
    scores = torch.tensor([0.9, 0.5, 0.4, 0.1])
    labels = torch.tensor([True, False, True, False])
    assert terminal_auc(scores, labels) == pytest.approx(0.75)


def test_terminal_auc_counts_a_tie_as_half_a_pair():
    # Positives 0.5, 0.7; negatives 0.5, 0.2: (0.5=0.5 -> 1/2, 0.5>0.2, 0.7>0.5, 0.7>0.2) -> 3.5 of 4.
    scores = torch.tensor([0.5, 0.5, 0.7, 0.2])
    labels = torch.tensor([True, False, True, False])
    assert terminal_auc(scores, labels) == pytest.approx(0.875)


def test_terminal_auc_of_constant_scores_is_one_half_and_of_one_class_is_nan():
    assert terminal_auc(torch.zeros(5), torch.tensor([True, False, True, False, False])) == pytest.approx(0.5)
    assert math.isnan(terminal_auc(torch.tensor([0.1, 0.2]), torch.tensor([True, True])))


def test_terminal_auc_is_one_for_a_perfect_ranking_and_zero_for_a_reversed_one():
    scores = torch.tensor([3.0, 2.0, 1.0, 0.0])
    assert terminal_auc(scores, torch.tensor([True, True, False, False])) == pytest.approx(1.0)
    assert terminal_auc(scores, torch.tensor([False, False, True, True])) == pytest.approx(0.0)


def test_held_out_split_keeps_every_group_on_one_side():
    groups = [0, 0, 0, 1, 1, 1, 2, 2, 2, 3, 3, 3, 4, 4, 4]
    train, held = held_out_split(groups, 0.4, seed=7)
    assert sorted(train + held) == list(range(len(groups)))
    assert {groups[i] for i in train}.isdisjoint({groups[i] for i in held})
    assert len({groups[i] for i in held}) == 2  # round(0.4 x 5 groups)
    assert held_out_split(groups, 0.4, seed=7) == (train, held)  # deterministic for a seed


def test_held_out_split_keys_by_prompt_so_a_redrawn_prompt_stays_on_its_side():
    prompts = [(1, 2), (1, 2), (3,), (3,), (1, 2), (1, 2), (5,), (5,)]  # (1, 2) drawn twice (two groups)
    train, held = held_out_split(prompts, 0.3, seed=0)
    assert {prompts[i] for i in train}.isdisjoint({prompts[i] for i in held})


def test_held_out_split_refuses_to_leave_nothing_to_train_on():
    with pytest.raises(ValueError, match="leaves none to train on"):
        held_out_split([0, 0, 1, 1], 0.9, seed=0)
    train, held = held_out_split([0, 1], 0.0, seed=0)
    assert (train, held) == ([0, 1], [])


def test_reward_to_go_is_the_return_at_every_response_token_with_gamma_one():
    mask = torch.tensor([[0, 0, 1, 1, 1, 0], [0, 1, 1, 0, 0, 0]], dtype=torch.float32)
    targets = reward_to_go_targets(torch.tensor([2.0, -1.0]), mask, gamma=1.0)
    expected = torch.tensor([[0, 0, 2, 2, 2, 0], [0, -1, -1, 0, 0, 0]], dtype=torch.float32)
    assert torch.equal(targets, expected)


def test_reward_to_go_discounts_by_the_response_tokens_still_to_come():
    mask = torch.tensor([[0, 1, 1, 1]], dtype=torch.float32)
    targets = reward_to_go_targets(torch.tensor([1.0]), mask, gamma=0.5)
    assert torch.allclose(targets, torch.tensor([[0.0, 0.25, 0.5, 1.0]]))


def test_offline_targets_subtract_the_leave_one_out_baseline_when_residual():
    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0])
    group_ids = torch.tensor([0, 0, 0, 1])
    mask = torch.tensor([[0, 1, 1]] * 4, dtype=torch.float32)
    baseline, _ = leave_one_out_baseline(rewards, group_ids)  # [0, 0.5, 0.5, 1 (singleton: its own reward)]
    targets, to_abs, to_res = offline_critic_targets(gae(residual_baseline=True), rewards, mask, baseline)
    assert torch.allclose(targets[:, 1:], torch.tensor([[1.0, 1.0], [-0.5, -0.5], [-0.5, -0.5], [0.0, 0.0]]))
    assert torch.equal(targets[:, 0], torch.zeros(4))
    assert torch.allclose(to_abs, baseline) and torch.equal(to_res, torch.zeros(4))
    absolute, to_abs, to_res = offline_critic_targets(gae(), rewards, mask, baseline)
    assert torch.allclose(absolute[:, 1:], rewards[:, None].expand(4, 2))
    assert torch.equal(to_abs, torch.zeros(4)) and torch.allclose(to_res, -baseline)


def test_offline_targets_refuse_raw_reward_and_discounted_turn_gae():
    mask = torch.ones(1, 2)
    raw = AdvEstimatorConfig(name="raw_reward", normalize_advantages=True, residual_baseline=False)
    with pytest.raises(ValueError, match="trains no critic"):
        offline_critic_targets(raw, torch.ones(1), mask, torch.zeros(1))
    turn = turn_gae(normalize_advantages=True, turn_gae_gamma=0.9, turn_gae_lambda_policy=0.5)
    with pytest.raises(ValueError, match="turn_gae_gamma"):
        offline_critic_targets(turn, torch.ones(1), mask, torch.zeros(1))


def test_terminal_value_is_read_at_the_last_response_token():
    values = torch.tensor([[0.0, 1.0, 2.0, 3.0, 4.0], [0.0, 5.0, 6.0, 7.0, 8.0]])
    mask = torch.tensor([[0, 1, 1, 0, 0], [0, 0, 1, 1, 1]], dtype=torch.float32)
    assert torch.equal(terminal_values(values, mask), torch.tensor([2.0, 8.0]))
    with pytest.raises(ValueError, match="no response token"):
        terminal_values(values, torch.tensor([[0, 1, 0, 0, 0], [0, 0, 0, 0, 0]], dtype=torch.float32))
