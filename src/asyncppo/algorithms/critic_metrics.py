"""Critic diagnostics on rollout-time values (the critic before any update this step): explained variance,
positional (early / mid / late) quality, calibration (ECE) and mixed-group EV. Called by the trainer once per
step with the values GAE consumed, on the whole batch (not per micro-batch).

Two spaces: the critic is trained on returns G (absolute, or residual G = R - B with the residual baseline).
`returns_to_abs` / `returns_to_res` are per-sequence offsets that move G (and V) into the absolute and the
residual space; the error G - V is the same in both. Shapes: B sequences, S token positions; values, returns,
masks [B, S]; offsets, sample_mask, group_homogeneous [B].
"""

import torch

from asyncppo.algorithms.masked import masked_mean, masked_var

BUCKETS = ("early", "mid", "late")
MIN_VARIANCE = 1e-8


def explained_variance(error_variance: float, target_variance: float) -> float:
    """ev = 1 - Var(G - V) / Var(target); 0.0 when Var(target) <= 1e-8 (nothing to explain)."""
    if target_variance <= MIN_VARIANCE:
        return 0.0
    return 1.0 - error_variance / target_variance


def _offsets(offset: torch.Tensor | None, like: torch.Tensor) -> torch.Tensor:
    """[B] offset (or zeros) broadcast over tokens as [B, 1], float64."""
    if offset is None:
        return torch.zeros(like.shape[0], 1, dtype=torch.float64, device=like.device)
    return offset.double().reshape(-1, 1)


def pooled_explained_variance(
    values: torch.Tensor,
    returns: torch.Tensor,
    mask: torch.Tensor,
    returns_to_abs: torch.Tensor | None = None,
    returns_to_res: torch.Tensor | None = None,
) -> tuple[float, float]:
    """(ev_abs, ev_res) pooled over every token where mask > 0, weighted by mask; (0, 0) with < 2 tokens.

    err_var = Var(G - V) (biased, shared by both spaces); ev_abs = 1 - err_var / Var(G + returns_to_abs),
    ev_res = 1 - err_var / Var(G + returns_to_res), each 0.0 when its denominator <= 1e-8.
    """
    with torch.no_grad():
        weights = mask.double()
        if int((weights > 0).sum()) < 2:
            return 0.0, 0.0
        values, returns = values.double(), returns.double()
        error_variance = float(masked_var(returns - values, weights, unbiased=False))
        abs_variance = float(masked_var(returns + _offsets(returns_to_abs, returns), weights, unbiased=False))
        res_variance = float(masked_var(returns + _offsets(returns_to_res, returns), weights, unbiased=False))
        return explained_variance(error_variance, abs_variance), explained_variance(error_variance, res_variance)


def calibration_ece(values: torch.Tensor, returns: torch.Tensor, mask: torch.Tensor, num_bins: int = 10) -> float:
    """Expected calibration error of absolute-space values against absolute-space returns (meaningful in [0, 1]).

    Bin b = min(floor(clamp(V, 0, 1) num_bins), num_bins - 1) (equal bins, the last one includes 1.0);
    ECE = sum_b (n_b / N) |mean(V_b) - mean(G_b)| = sum_b |sum_{t in b} (V - G) m| / N, where the bin means use
    the UNclamped V and n, N are mask-weighted counts. 0.0 when nothing is valid.
    """
    with torch.no_grad():
        weights = mask.double().flatten()
        total = weights.sum()
        if not total > 0:
            return 0.0
        flat_values = values.double().flatten()
        bins = (flat_values.clamp(0.0, 1.0) * num_bins).floor().long().clamp(max=num_bins - 1)
        signed_gap = (flat_values - returns.double().flatten()) * weights
        gap_per_bin = torch.zeros(num_bins, dtype=torch.float64, device=values.device).index_add_(0, bins, signed_gap)
        return float(gap_per_bin.abs().sum() / total)


def position_buckets(mask: torch.Tensor, num_buckets: int = len(BUCKETS)) -> torch.Tensor:
    """Bucket index [B, S] of every valid token by its relative position rel = (cumsum(m) - 1) / count in its sequence.

    Bucket k holds rel in [k/n, (k+1)/n) (the last one closes at 1); integer arithmetic, so rel = 1/3 is exactly
    'mid'. Invalid positions get -1.
    """
    valid = mask > 0
    rank = valid.long().cumsum(dim=1) - 1
    counts = valid.long().sum(dim=1, keepdim=True).clamp(min=1)
    bucket = torch.div(rank * num_buckets, counts, rounding_mode="floor").clamp(max=num_buckets - 1)
    return torch.where(valid, bucket, -1)


def positional_value_metrics(
    values: torch.Tensor,
    returns: torch.Tensor,
    metric_mask: torch.Tensor,
    returns_to_abs: torch.Tensor | None = None,
    returns_to_res: torch.Tensor | None = None,
) -> dict[str, float]:
    """Per bucket (early / mid / late) with >= 2 tokens of metric_mask (NOT multiplied by sample_mask):

    critic/ev_{b}, critic/ev_res_{b} (as `pooled_explained_variance`), critic/abs_err_{b} = mean|G - V|,
    critic/mean_v_{b} = mean(V) (raw head output), critic/n_tokens_{b}, critic/bias_{b} = mean(V - G) (> 0:
    optimistic), critic/ece_{b} (`calibration_ece` on V + returns_to_abs, G + returns_to_abs).
    """
    metrics: dict[str, float] = {}
    with torch.no_grad():
        buckets = position_buckets(metric_mask)
        to_abs = _offsets(returns_to_abs, returns)
        values64, returns64 = values.double(), returns.double()
        for index, name in enumerate(BUCKETS):
            bucket_mask = metric_mask.double() * (buckets == index)
            num_tokens = int((bucket_mask > 0).sum())
            if num_tokens < 2:
                continue
            ev_abs, ev_res = pooled_explained_variance(values, returns, bucket_mask, returns_to_abs, returns_to_res)
            metrics[f"critic/ev_{name}"] = ev_abs
            metrics[f"critic/ev_res_{name}"] = ev_res
            metrics[f"critic/abs_err_{name}"] = float(masked_mean((returns64 - values64).abs(), bucket_mask))
            metrics[f"critic/mean_v_{name}"] = float(masked_mean(values64, bucket_mask))
            metrics[f"critic/n_tokens_{name}"] = float(num_tokens)
            metrics[f"critic/bias_{name}"] = float(masked_mean(values64 - returns64, bucket_mask))
            metrics[f"critic/ece_{name}"] = calibration_ece(values64 + to_abs, returns64 + to_abs, bucket_mask)
    return metrics


def mixed_group_value_metrics(
    values: torch.Tensor,
    returns: torch.Tensor,
    metric_mask: torch.Tensor,
    sample_mask: torch.Tensor,
    group_homogeneous: torch.Tensor,
    returns_to_abs: torch.Tensor | None = None,
    returns_to_res: torch.Tensor | None = None,
) -> dict[str, float]:
    """Residual-space EV restricted to rollouts whose prompt group has varying reward (group_homogeneous False).

    Homogeneous groups have residual target 0 everywhere, so they pull pooled ev_res towards the critic's skill at
    predicting 0; this isolates the groups that carry a learning signal. critic/ev_res_mixed_group and
    critic/n_mixed_group_tokens use metric_mask x sample_mask; critic/ev_res_mixed_group_{b} use the bucketed
    metric mask (positions counted within each sequence, so restricting rows moves no position).
    """
    with torch.no_grad():
        mixed = (~group_homogeneous.bool()).double()[:, None]
        pooled_mask = metric_mask.double() * sample_mask.double()[:, None] * mixed
        _, ev_res = pooled_explained_variance(values, returns, pooled_mask, returns_to_abs, returns_to_res)
        metrics = {
            "critic/ev_res_mixed_group": ev_res,
            "critic/n_mixed_group_tokens": float((pooled_mask > 0).sum()),
        }
        buckets = position_buckets(metric_mask)
        for index, name in enumerate(BUCKETS):
            bucket_mask = metric_mask.double() * mixed * (buckets == index)
            if int((bucket_mask > 0).sum()) >= 2:
                _, bucket_ev = pooled_explained_variance(values, returns, bucket_mask, returns_to_abs, returns_to_res)
                metrics[f"critic/ev_res_mixed_group_{name}"] = bucket_ev
        return metrics


def critic_diagnostics(
    values: torch.Tensor,
    returns: torch.Tensor,
    metric_mask: torch.Tensor,
    sample_mask: torch.Tensor,
    returns_to_abs: torch.Tensor | None = None,
    returns_to_res: torch.Tensor | None = None,
    group_homogeneous: torch.Tensor | None = None,
) -> dict[str, float]:
    """All pre-update critic metrics of a step: critic/explained_var and critic/ev_res (pooled over
    metric_mask x sample_mask), the positional metrics, and the mixed-group metrics when group_homogeneous is
    given (absent otherwise). metric_mask is the token mask, or the anchor mask in turn mode.
    """
    ev_abs, ev_res = pooled_explained_variance(
        values, returns, metric_mask * sample_mask[:, None], returns_to_abs, returns_to_res
    )
    metrics = {"critic/explained_var": ev_abs, "critic/ev_res": ev_res}
    metrics.update(positional_value_metrics(values, returns, metric_mask, returns_to_abs, returns_to_res))
    if group_homogeneous is not None:
        metrics.update(
            mixed_group_value_metrics(
                values, returns, metric_mask, sample_mask, group_homogeneous, returns_to_abs, returns_to_res
            )
        )
    return metrics
