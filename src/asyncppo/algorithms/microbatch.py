"""Global-batch normalisation across micro-batches: the counts every loss divides by, and the metric reducer.

A training step splits one GLOBAL batch into micro-batches. Every loss and every metric of a micro-batch is
divided by a count taken over the GLOBAL batch, so summing micro-batch results (losses, gradients, metric
contributions) gives exactly the global-batch number. Called by the policy and value losses and by the workers
that reduce their per-micro-batch metrics.

Shapes: B sequences, S token positions.
"""

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class LossNormalizers:
    """Global-batch counts that the losses divide by (floats: `sample_mask` may be fractional).

    valid_tokens:    sum_{i,t>=1} token_mask[i,t] * sample_mask[i]
    valid_seqs:      sum_i sample_mask[i]
    positive_tokens: sum_{i,t>=1} token_mask[i,t] * sample_mask[i] * 1[rewards[i] > 0]   (positive-example NLL)
    """

    valid_tokens: float
    valid_seqs: float
    positive_tokens: float


def loss_normalizers(
    token_mask: torch.Tensor, sample_mask: torch.Tensor, rewards: torch.Tensor | None = None
) -> LossNormalizers:
    """Count over the WHOLE global batch ([B, S] token_mask, [B] sample_mask, [B] rewards) before splitting it.

    Column 0 is dropped (it never holds a logprob), matching the policy loss; the value loss uses the same
    `valid_tokens` because token_mask[:, 0] is 0 for any real batch (position 0 is a prompt token).
    """
    weights = token_mask[:, 1:].double() * sample_mask.double()[:, None]
    positive = 0.0 if rewards is None else float((weights * (rewards > 0).double()[:, None]).sum())
    return LossNormalizers(
        valid_tokens=float(weights.sum()), valid_seqs=float(sample_mask.double().sum()), positive_tokens=positive
    )


def masked_min(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """min of x where mask > 0; +inf when nothing is valid (the reducer ignores it)."""
    return torch.where(mask > 0, x, torch.inf).amin() if x.numel() else x.new_tensor(torch.inf)


def masked_max(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """max of x where mask > 0; -inf when nothing is valid (the reducer ignores it)."""
    return torch.where(mask > 0, x, -torch.inf).amax() if x.numel() else x.new_tensor(-torch.inf)


def scalars_to_floats(scalars: Mapping[str, torch.Tensor]) -> dict[str, float]:
    """0-dim tensors -> Python floats with one device-to-host copy (one sync instead of one per metric)."""
    if not scalars:
        return {}
    stacked = torch.stack([value.detach().reshape(()).double() for value in scalars.values()]).cpu()
    return {key: float(stacked[i]) for i, key in enumerate(scalars)}


def reduce_metrics_by_key(
    metrics: Iterable[Mapping[str, float]],
    combine: Callable[[list[float]], float],
    *,
    skip_infinite_extremes: bool = False,
) -> dict[str, float]:
    """One number per key: `_min` keys reduce by min, `_max` keys by max, every other key by `combine`.

    With `skip_infinite_extremes`, +-inf is ignored by min and max (a micro-batch with no valid token reports
    +-inf) and a key with no finite value left gives -1.0. A key missing from some entries reduces over those
    that have it.
    """
    collected: dict[str, list[float]] = {}
    for entry in metrics:
        for key, value in entry.items():
            collected.setdefault(key, []).append(value)
    reduced: dict[str, float] = {}
    for key, values in collected.items():
        if not key.endswith(("_min", "_max")):
            reduced[key] = combine(values)
            continue
        extremes = [value for value in values if not math.isinf(value)] if skip_infinite_extremes else values
        if not extremes:
            reduced[key] = -1.0
        else:
            reduced[key] = min(extremes) if key.endswith("_min") else max(extremes)
    return reduced


def reduce_microbatch_metrics(metrics: Sequence[Mapping[str, float]]) -> dict[str, float]:
    """Combine per-micro-batch metrics into global-batch metrics.

    Keys ending in `_min` reduce by min and keys ending in `_max` by max, ignoring +-inf and giving -1.0 when no
    finite value is left. Every other key is a contribution already divided by a global count, so it reduces by
    sum.
    """
    return reduce_metrics_by_key(metrics, math.fsum, skip_infinite_extremes=True)
