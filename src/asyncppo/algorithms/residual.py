"""Residual baseline: a leave-one-out group baseline B plus a critic C that learns only the residual V* - B.

Called by `advantages.compute_advantages`, which always runs these pieces around gae / turn_gae (when the
residual baseline is off they still supply the offsets and group metrics, so both arms log the same keys).
Shapes: B batch, S sequence positions, G group size.

Decomposition V*(s) = B(X) + C(s) with E[C | X] = 0: the rollouts of one prompt X supply B, the critic learns C.
The inner estimator runs on V~ = C + B, so its advantages are exactly those of absolute GAE on V~; its returns
are mapped back to residual space, Y = G - B * return_mask. At gamma = 1, B cancels from every non-terminal TD
error, which is why gamma must be 1.
"""

from typing import cast

import torch

HOMOGENEOUS_VARIANCE = 1e-12


def group_ids_from_prompts(prompt_token_ids: torch.Tensor) -> torch.Tensor:
    """Group ids `[B]` (0 .. num_groups-1 by first appearance): identical padded prompt rows `[B, P]` share one."""
    # torch.unique is assembled by boolean dispatch and has no static signature, hence the ignore and cast.
    unique_out = torch.unique(prompt_token_ids, dim=0, return_inverse=True)  # pyright: ignore[reportUnknownMemberType, reportUnknownVariableType]
    inverse = cast(torch.Tensor, unique_out[1])
    num_groups = int(inverse.max().item()) + 1 if inverse.numel() else 0
    positions = torch.arange(inverse.numel(), device=inverse.device)
    first = torch.full((num_groups,), inverse.numel(), dtype=torch.long, device=inverse.device)
    first = first.scatter_reduce(0, inverse, positions, reduce="amin")
    rank = torch.empty_like(first)
    rank[first.argsort()] = torch.arange(num_groups, device=inverse.device)
    return rank[inverse]


def dense_groups(group_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(dense group index `[B]` in 0 .. num_groups-1, ordered by id; group sizes `[num_groups]`) of ids `[B]`."""
    sorted_ids, order = group_ids.sort(stable=True)
    starts = torch.ones_like(sorted_ids, dtype=torch.bool)
    starts[1:] = sorted_ids[1:] != sorted_ids[:-1]
    inverse = torch.empty_like(order)
    inverse[order] = starts.long().cumsum(0) - 1
    return inverse, torch.bincount(inverse)


def _group_sums(x: torch.Tensor, inverse: torch.Tensor, num_groups: int) -> torch.Tensor:
    return torch.zeros(num_groups, dtype=x.dtype, device=x.device).index_add(0, inverse, x)


def leave_one_out_baseline(rewards: torch.Tensor, group_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(baseline `[B]` fp32, group size per sample `[B]`).

    B_i = (sum_{j in g(i)} R_j - R_i) / (|g(i)| - 1); a singleton group gets B_i = R_i (target 0).
    Accumulated in fp64, returned in fp32. Every rollout counts for its siblings, whatever its sample_mask.
    """
    if rewards.shape != group_ids.shape or rewards.dim() != 1:
        raise ValueError(f"rewards {tuple(rewards.shape)} and group_ids {tuple(group_ids.shape)} must both be [B]")
    inverse, counts = dense_groups(group_ids)
    r = rewards.double()
    sums = _group_sums(r, inverse, counts.numel())
    size = counts[inverse]
    others = (size - 1).clamp(min=1).double()
    baseline = torch.where(size > 1, (sums[inverse] - r) / others, r)
    return baseline.float(), size


def group_composition(
    rewards: torch.Tensor, group_ids: torch.Tensor, baseline: torch.Tensor, sample_mask: torch.Tensor
) -> tuple[torch.Tensor, dict[str, float]]:
    """(group_homogeneous `[B]` bool, residual/* group metrics).

    Homogeneous <=> within-group reward variance (biased) <= 1e-12, which holds under reward scaling and for
    fractional rewards; all_fail / all_pass = homogeneous with the group mean at the batch min / max reward.
    target_var is the biased variance over samples of R - B (the residual critic's lambda = 1 target).
    """
    inverse, counts = dense_groups(group_ids)
    num_groups = counts.numel()
    r = rewards.double()
    means = _group_sums(r, inverse, num_groups) / counts.double()
    variances = _group_sums((r - means[inverse]).square(), inverse, num_groups) / counts.double()
    homogeneous = variances <= HOMOGENEOUS_VARIANCE
    low, high = r.min(), r.max()
    all_fail = homogeneous & torch.isclose(means, low, rtol=1e-6, atol=1e-6)
    all_pass = homogeneous & torch.isclose(means, high, rtol=1e-6, atol=1e-6)
    b = baseline.double()
    metrics = {
        "residual/b_loo_mean": b.mean().item(),
        "residual/b_loo_std": b.std(correction=0).item(),
        "residual/target_var": (r - b).var(correction=0).item(),
        "residual/frac_groups_mixed": (~homogeneous).double().mean().item(),
        "residual/frac_groups_all_fail": all_fail.double().mean().item(),
        "residual/frac_groups_all_pass": all_pass.double().mean().item(),
        "residual/n_singleton_groups": float((counts == 1).sum().item()),
        "residual/group_size_min": float(counts.min().item()),
        "residual/group_size_max": float(counts.max().item()),
        "residual/frac_traj_sample_masked": (sample_mask <= 0).double().mean().item(),
    }
    return homogeneous[inverse], metrics


def residual_returns(returns: torch.Tensor, baseline: torch.Tensor, return_mask: torch.Tensor) -> torch.Tensor:
    """Y = G - B * return_mask: `[B, S]` absolute returns to residual space, never writing -B off the mask."""
    return returns - baseline.to(returns.dtype).unsqueeze(1) * return_mask.to(returns.dtype)


def residual_offsets(baseline: torch.Tensor, residual_baseline: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """(returns_to_abs `[B]`, returns_to_res `[B]`): what to add to a target to move it to either space.

    on: targets are residual, so to_abs = B and to_res = 0; off: targets are absolute, so to_abs = 0, to_res = -B.
    """
    zeros = torch.zeros_like(baseline)
    return (baseline, zeros) if residual_baseline else (zeros, -baseline)


def homogeneous_group_sample_mask(
    sample_mask: torch.Tensor, group_homogeneous: torch.Tensor | None, weight: float
) -> torch.Tensor:
    """New critic sample mask `[B]`: sample_mask * (1 - h * (1 - w)), h = 1 for rollouts in homogeneous groups.

    Down-weights groups whose residual targets are all 0 (w = 1 leaves the mask unchanged). The input is not
    modified. Raises ValueError for w < 0 or missing / mis-sized group information.
    """
    if weight < 0:
        raise ValueError(f"homogeneous_group_weight={weight} must be >= 0")
    if group_homogeneous is None:
        raise ValueError("homogeneous_group_sample_mask needs group_homogeneous from the residual estimator")
    if group_homogeneous.shape != sample_mask.shape:
        raise ValueError(
            f"group_homogeneous {tuple(group_homogeneous.shape)} does not match sample_mask {tuple(sample_mask.shape)}"
        )
    h = group_homogeneous.to(sample_mask.dtype) if sample_mask.is_floating_point() else group_homogeneous.float()
    return sample_mask * (1.0 - h * (1.0 - weight))
