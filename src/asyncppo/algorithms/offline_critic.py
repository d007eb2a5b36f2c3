"""Offline critic pretraining math: reward-to-go targets, the held-out split by prompt group, terminal AUC.

Called by `trainer/critic_pretraining.py`, which trains the value model alone on stored rollout shards.
Shapes: B samples, S positions, N scored samples.

    rewards [B], token_mask [B, S] --reward_to_go_targets (- residual baseline B)--> targets [B, S]
    values [B, S] --terminal_values--> [B] --terminal_auc(vs reward > threshold)--> how well V ranks successes
"""

import random
from collections.abc import Hashable, Sequence

import torch

from asyncppo.algorithms import residual
from asyncppo.config.ppo import AdvEstimatorConfig


def reward_to_go_targets(rewards: torch.Tensor, token_mask: torch.Tensor, gamma: float) -> torch.Tensor:
    """Monte Carlo targets `[B, S]` of a terminal reward: G_t = gamma^k_t * R, k_t = response tokens after t.

    With gamma = 1 every response token's target is the return R. 0 off the token mask (prompt, padding).
    """
    if rewards.dim() != 1 or token_mask.dim() != 2 or rewards.shape[0] != token_mask.shape[0]:
        raise ValueError(f"rewards {tuple(rewards.shape)} must be [B] and token_mask {tuple(token_mask.shape)} [B, S]")
    mask = token_mask.to(torch.float64)
    # Response tokens strictly after t: the reversed inclusive cumsum minus the token itself.
    tokens_after = mask.flip(1).cumsum(1).flip(1) - mask
    discount = torch.pow(torch.tensor(gamma, dtype=torch.float64), tokens_after)
    return (discount * rewards.to(torch.float64).unsqueeze(1) * mask).to(torch.float32)


def offline_critic_targets(
    settings: AdvEstimatorConfig, rewards: torch.Tensor, token_mask: torch.Tensor, baseline: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(targets `[B, S]`, returns_to_abs `[B]`, returns_to_res `[B]`) in the space the PPO critic learns in.

    Reward-to-go at the estimator's discount (the lambda = 1 return, which needs no critic); with
    residual_baseline the leave-one-out group baseline `[B]` (`residual.leave_one_out_baseline` over whole
    groups, which a sampled mini-batch may split) is subtracted, as the PPO step does. turn_gae discounts per
    turn, not per token, so only gamma = 1 (where both agree) is accepted for it.
    """
    if not settings.uses_critic:
        raise ValueError(f"ppo.adv_estimator.name: {settings.name!r} trains no critic; offline pretraining needs one")
    gamma = settings.gamma
    if settings.name == "turn_gae" and gamma != 1.0:
        raise ValueError(
            f"ppo.adv_estimator.turn_gae_gamma: {gamma} is not supported by offline pretraining (token-level "
            "reward-to-go targets equal turn-level ones only at gamma = 1); set it to 1.0"
        )
    targets = reward_to_go_targets(rewards, token_mask, gamma)
    on = bool(settings.residual_baseline)
    if on:
        targets = residual.residual_returns(targets, baseline, token_mask)
    to_abs, to_res = residual.residual_offsets(baseline, on)
    return targets, to_abs, to_res


def terminal_values(values: torch.Tensor, token_mask: torch.Tensor) -> torch.Tensor:
    """`[B]` the value at each row's last response token (right-shifted: V of the state before that token)."""
    positions = torch.arange(token_mask.shape[1], device=token_mask.device).expand_as(token_mask)
    has_response = token_mask.sum(1) > 0
    if not bool(has_response.all()):
        rows = [int(row) for row in torch.nonzero(~has_response).flatten()]
        raise ValueError(f"rows {rows[:5]} have no response token, so no terminal value")
    last = torch.where(token_mask > 0, positions, -1).amax(1)
    return values.gather(1, last.unsqueeze(1)).squeeze(1)


def terminal_auc(scores: torch.Tensor, labels: torch.Tensor) -> float:
    """ROC AUC of `scores [N]` for boolean `labels [N]`: P(score of a positive > score of a negative), ties 1/2.

    Rank-based (Mann-Whitney U with average ranks for ties); NaN when either class is empty.
    """
    if scores.shape != labels.shape or scores.dim() != 1:
        raise ValueError(f"scores {tuple(scores.shape)} and labels {tuple(labels.shape)} must both be [N]")
    positives = labels.bool()
    num_positive, num_negative = int(positives.sum()), int((~positives).sum())
    if num_positive == 0 or num_negative == 0:
        return float("nan")
    values = scores.double()
    sorted_values, order = values.sort()
    ranks = torch.empty_like(values)
    ranks[order] = torch.arange(1, len(values) + 1, dtype=torch.float64)
    # Tied scores share the mean of their ranks: tie_group numbers the runs of equal sorted scores.
    starts = torch.ones_like(sorted_values, dtype=torch.bool)
    starts[1:] = sorted_values[1:] != sorted_values[:-1]
    tie_group = starts.long().cumsum(0) - 1
    num_ties = int(tie_group[-1]) + 1
    rank_sums = torch.zeros(num_ties, dtype=torch.float64).index_add(0, tie_group, ranks[order])
    counts = torch.bincount(tie_group, minlength=num_ties).double()
    ranks[order] = (rank_sums / counts)[tie_group]
    u_statistic = float(ranks[positives].sum()) - num_positive * (num_positive + 1) / 2
    return u_statistic / (num_positive * num_negative)


def held_out_split(group_keys: Sequence[Hashable], fraction: float, seed: int) -> tuple[list[int], list[int]]:
    """(train sample indices, held-out sample indices): every sample of a key goes to one side, never split.

    A key names a prompt group (a group id, or the prompt itself, so that a prompt drawn again in a later epoch
    stays on its side). round(fraction x keys) keys are held out (at least 1 when fraction > 0), chosen by a
    seeded shuffle of the keys in order of first appearance; ValueError when that leaves none to train on.
    """
    if not 0 <= fraction < 1:
        raise ValueError(f"held-out fraction must be in [0, 1), got {fraction}")
    keys = list(dict.fromkeys(group_keys))
    num_held_out = max(1, round(fraction * len(keys))) if fraction > 0 else 0
    if num_held_out >= len(keys):
        raise ValueError(f"holding out {num_held_out} of {len(keys)} prompt groups leaves none to train on")
    random.Random(seed).shuffle(keys)
    held_out = set(keys[:num_held_out])
    train = [index for index, key in enumerate(group_keys) if key not in held_out]
    held = [index for index, key in enumerate(group_keys) if key in held_out]
    return train, held
