"""The optimizer loop the policy and value workers share: one pass over a step batch, one optimizer step per
global batch, gradients accumulated over micro-batches.

    step batch --global_batch_rows--> global batch g --normalize--> counts over ALL of g (every rank)
                                          |  (rank's share, then micro-batches)
                                          v
                     micro-batch --loss_fn(micro, counts)--> loss.backward()   (sum of micro losses = loss of g)
                                          v
                     clip by global norm -> optimizer.step() -> scheduler.step() -> zero_grad

Called by `PolicyWorker.train` and `ValueWorker.train`; the loss functions live in `algorithms/`.
"""

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import torch
from torch import nn
from torch.optim.lr_scheduler import LRScheduler

from asyncppo.algorithms.microbatch import LossNormalizers, reduce_metrics_by_key, reduce_microbatch_metrics
from asyncppo.types import TrainBatch
from asyncppo.workers.data_parallel import (
    DataParallel,
    all_ranks_finite,
    full_tensor,
    gather_objects,
    max_over_ranks,
    sum_over_ranks,
)
from asyncppo.workers.microbatches import (
    TokenTally,
    global_batch_rows,
    microbatch_rows,
    row_lengths,
    shard_rows,
    trim_padding,
    without_loss,
)


@dataclass(frozen=True)
class BatchPlan:
    """How a pass cuts its batch: samples per optimizer step, and per forward/backward (count or token budget)."""

    global_batch_size: int | None
    micro_batch_size: int
    max_tokens_per_microbatch: int | None
    packed: bool = False
    """The forward packs its rows (real tokens only): the token budget counts real tokens."""


@dataclass(frozen=True)
class MicroBatch:
    """One forward/backward's input: the trimmed micro-batch on the device, and its step-batch row indices."""

    batch: TrainBatch
    rows: torch.Tensor
    """[b] long on CPU: index per-sample side inputs of the step batch with it."""
    stand_in: bool = False
    """A loss-free filler that evens out the ranks' micro-batch counts: its outputs belong to no row."""


LossFunction = Callable[[MicroBatch, LossNormalizers], tuple[torch.Tensor, dict[str, float]]]
Normalize = Callable[[TrainBatch], LossNormalizers]


class NonFiniteTrainingError(RuntimeError):
    """A loss or gradient norm was NaN or infinite; the optimizer step was not taken."""


def _microbatch_groups(
    rows: range, lengths: Sequence[int], plan: BatchPlan, group: DataParallel | None
) -> list[tuple[list[int], bool]]:
    """This rank's micro-batches of one global batch as (step-batch rows, is_padding).

    Ranks pad to the same count with a loss-free copy of the global batch's first row, since every
    forward/backward of a sharded model is a collective.
    """
    local = list(rows) if group is None else shard_rows(rows, group.rank, group.world_size)
    groups = [
        (rows_, False)
        for rows_ in microbatch_rows(local, lengths, plan.micro_batch_size, plan.max_tokens_per_microbatch, plan.packed)
    ]
    target = max_over_ranks(len(groups), group)
    return groups + [([rows[0]], True)] * (target - len(groups))


def _forward_global_batch(
    batch: TrainBatch,
    rows: range,
    lengths: Sequence[int],
    loss_fn: LossFunction,
    normalizers: LossNormalizers,
    plan: BatchPlan,
    device: torch.device,
    group: DataParallel | None,
    backward: bool,
    tally: TokenTally,
) -> tuple[torch.Tensor, list[dict[str, float]]]:
    """Run (and with `backward`, backpropagate) every micro-batch; returns the summed loss and their metrics.
    `tally` counts the token positions computed."""
    loss_sum = torch.zeros((), dtype=torch.float32, device=device)
    metrics: list[dict[str, float]] = []
    for micro_rows, is_padding in _microbatch_groups(rows, lengths, plan, group):
        micro = trim_padding(batch.select(micro_rows))
        tally.add(micro.attention_mask, plan.packed, stand_in=is_padding)
        if is_padding:
            micro = without_loss(micro)
        loss, micro_metrics = loss_fn(MicroBatch(micro.to(device), torch.tensor(micro_rows), is_padding), normalizers)
        if backward:
            loss.backward()
        loss_sum += loss.detach().float()
        metrics.append(micro_metrics)
    return loss_sum, metrics


def _checked_grad_norm(
    loss_sum: torch.Tensor,
    optimizer: torch.optim.Optimizer,
    parameters: Sequence[nn.Parameter],
    max_grad_norm: float | None,
    group: DataParallel | None,
    where: str,
) -> float:
    """The pre-clip gradient norm of a global batch, gradients clipped (`_clip_gradients`); NonFiniteTrainingError
    naming `where`, gradients dropped and no step taken, when the loss on any rank or the norm is not finite."""
    if not all_ranks_finite(loss_sum, group):
        optimizer.zero_grad(set_to_none=True)
        raise NonFiniteTrainingError(f"non-finite loss in {where}; no optimizer step was taken")
    grad_norm = _clip_gradients(parameters, max_grad_norm)
    if not math.isfinite(grad_norm):
        optimizer.zero_grad(set_to_none=True)
        raise NonFiniteTrainingError(f"non-finite gradient norm {grad_norm} in {where}; no optimizer step was taken")
    return grad_norm


def _clip_gradients(parameters: Sequence[nn.Parameter], max_grad_norm: float | None) -> float:
    """Global L2 norm of the gradients before clipping; clips them in place to `max_grad_norm` when set."""
    if max_grad_norm is None:
        grads = [parameter.grad for parameter in parameters if parameter.grad is not None]
        total = torch.nn.utils.get_total_norm(grads)
    else:
        total = torch.nn.utils.clip_grad_norm_(parameters, max_grad_norm)
    return float(full_tensor(total))


def average_over_global_batches(per_batch: Sequence[Mapping[str, float]]) -> dict[str, float]:
    """One number per key for a pass: `_min` keys take the min, `_max` keys the max, others the plain mean.

    Each global batch's metrics are already global means over that batch; the mean over global batches weighs
    every optimizer step equally (as the seed's Megatron path does by dividing by the number of global batches),
    not every token, so a smaller remainder batch counts as much as a full one.
    """
    return reduce_metrics_by_key(per_batch, lambda values: math.fsum(values) / len(values))


def train_pass(
    batch: TrainBatch,
    loss_fn: LossFunction,
    normalize: Normalize,
    *,
    plan: BatchPlan,
    optimizer: torch.optim.Optimizer,
    scheduler: LRScheduler,
    max_grad_norm: float | None,
    device: torch.device,
    group: DataParallel | None = None,
) -> dict[str, float]:
    """One pass over `batch`: per global batch, accumulate micro-batch gradients and take one optimizer step.

    `normalize` counts over the whole global batch (all ranks); a global batch with no valid token or sequence
    has nothing to learn and is skipped without a step (counted in `num_empty_global_batches`). Returns the
    loss metrics averaged over global batches (`average_over_global_batches`) plus `lr` (mean LR of the steps
    taken), `grad_norm` (mean pre-clip norm), `num_optimizer_steps`, `num_empty_global_batches`, and
    `tokens_computed` / `tokens_real` (token positions the forwards computed, padding included, and the real
    tokens among them, summed over micro-batches and ranks).
    Raises NonFiniteTrainingError naming the global batch when a loss or the gradient norm is not finite.
    """
    parameters = [parameter for group_ in optimizer.param_groups for parameter in group_["params"]]
    lengths = row_lengths(batch.attention_mask)
    per_batch: list[dict[str, float]] = []
    lrs: list[float] = []
    grad_norms: list[float] = []
    num_empty = 0
    tally = TokenTally()
    for index, rows in enumerate(global_batch_rows(len(batch), plan.global_batch_size)):
        normalizers = normalize(batch.select(list(rows)))
        if not (normalizers.valid_tokens > 0 and normalizers.valid_seqs > 0):
            num_empty += 1
            continue
        where = f"global batch {index} (rows {rows.start}..{rows.stop - 1})"
        loss_sum, metrics = _forward_global_batch(
            batch, rows, lengths, loss_fn, normalizers, plan, device, group, backward=True, tally=tally
        )
        grad_norm = _checked_grad_norm(loss_sum, optimizer, parameters, max_grad_norm, group, where)
        lrs.append(float(optimizer.param_groups[0]["lr"]))
        grad_norms.append(grad_norm)
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)
        per_batch.append(reduce_microbatch_metrics([m for rank in gather_objects(metrics, group) for m in rank]))
    result = average_over_global_batches(per_batch)
    result["lr"] = math.fsum(lrs) / len(lrs) if lrs else float(optimizer.param_groups[0]["lr"])
    if grad_norms:
        result["grad_norm"] = math.fsum(grad_norms) / len(grad_norms)
    result["num_optimizer_steps"] = float(len(lrs))
    result["num_empty_global_batches"] = float(num_empty)
    result["tokens_computed"], result["tokens_real"] = map(float, sum_over_ranks(tally.take(), group))
    return result


@torch.no_grad()
def evaluate_pass(
    batch: TrainBatch,
    loss_fn: LossFunction,
    normalize: Normalize,
    *,
    plan: BatchPlan,
    device: torch.device,
    group: DataParallel | None = None,
) -> dict[str, float]:
    """The loss and its metrics over the whole batch as ONE global batch, without gradients or a step.

    One global batch makes every summed statistic a mean over all of the batch's tokens (a post-update
    re-score wants the whole batch, not per-optimizer-step pieces). Raises NonFiniteTrainingError on a
    non-finite loss.
    """
    rows = range(len(batch))
    normalizers = normalize(batch)
    loss_sum, metrics = _forward_global_batch(
        batch,
        rows,
        row_lengths(batch.attention_mask),
        loss_fn,
        normalizers,
        plan,
        device,
        group,
        backward=False,
        tally=TokenTally(),
    )
    if not all_ranks_finite(loss_sum, group):
        raise NonFiniteTrainingError("non-finite loss while evaluating the batch")
    return reduce_microbatch_metrics([m for rank in gather_objects(metrics, group) for m in rank])
