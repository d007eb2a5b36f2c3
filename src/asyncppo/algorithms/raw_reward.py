"""raw_reward (GRPO-style) advantages: the sequence reward, optionally group-normalised, on every response token.

Called by `advantages.compute_advantages` when the estimator is `raw_reward`. Shapes: B batch, S sequence.

A run with this estimator has NO critic: there are no returns to train one on. NeMo-RL kept running the
critic forward and training it on the missing returns, a bug we do not copy; `AdvEstimatorConfig.uses_critic`
tells the trainer to build no value model.
"""

from typing import Literal

import torch

from asyncppo.algorithms.residual import dense_groups, leave_one_out_baseline

RawRewardBaseline = Literal["none", "mean", "leave_one_out"]


def raw_reward_advantages(
    rewards: torch.Tensor,
    token_mask: torch.Tensor,
    group_ids: torch.Tensor | None,
    baseline: RawRewardBaseline,
    normalize_by_std: bool,
    std_eps: float,
) -> torch.Tensor:
    """Advantages `[B, S]`: a_i = (R_i - b_i) / (std_g(i) + eps if normalize_by_std else 1), times the token mask.

    b_i: 0 ("none"), the group mean including i ("mean"), or the leave-one-out mean of the siblings
    ("leave_one_out"; a singleton group gets b_i = R_i). std_g is the unbiased reward std of i's whole group
    (0 for a singleton). `rewards` and `group_ids` are `[B]`, `token_mask` `[B, S]`.
    """
    # The schema rejects raw_reward_normalize_std without a baseline (ppo.adv_estimator).
    assert not (normalize_by_std and baseline == "none"), "normalize_by_std needs a baseline"
    if std_eps <= 0 and normalize_by_std:
        raise ValueError(f"raw_reward std_eps={std_eps} must be > 0")
    r = rewards.double()
    if baseline == "none":
        per_sample = r
    else:
        if group_ids is None:
            raise ValueError(f"raw_reward baseline={baseline!r} needs group_ids")
        inverse, counts = dense_groups(group_ids)
        sums = torch.zeros(counts.numel(), dtype=torch.float64, device=r.device).index_add(0, inverse, r)
        means = sums / counts.double()
        if baseline == "mean":
            per_sample = r - means[inverse]
        else:
            per_sample = r - leave_one_out_baseline(rewards, group_ids)[0].double()
        if normalize_by_std:
            squares = torch.zeros_like(sums).index_add(0, inverse, (r - means[inverse]).square())
            std = (squares / (counts - 1).clamp(min=1).double()).sqrt()
            per_sample = per_sample / (std[inverse] + std_eps)
    return per_sample.float().unsqueeze(1) * token_mask.float()
