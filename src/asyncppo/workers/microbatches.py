"""How a step batch is cut for training: global batches (one optimizer step each), a rank's share of one, and
micro-batches (one forward/backward each), by sample count or by a token budget: real tokens when the forward
packs its rows (no padding reaches the model), rows x longest row when it pads them.

Called by `training.train_pass` and by the workers' no-grad scoring. Everything here works on row indices of
the step batch, so per-sample side inputs (the critic's return-space offsets) follow the same cut.
Letters: B samples, S positions.
"""

from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields

import torch

from asyncppo.types import TrainBatch


def row_lengths(attention_mask: torch.Tensor) -> list[int]:
    """Per row, 1 + the last attended position (0 for an empty row): the columns a row needs. [B, S] -> B ints."""
    positions = torch.arange(1, attention_mask.shape[1] + 1, device=attention_mask.device)
    return (attention_mask.bool() * positions).amax(dim=1).tolist() if attention_mask.numel() else []


def global_batch_rows(num_samples: int, global_batch_size: int | None) -> list[range]:
    """Consecutive rows of each global batch; None = one global batch of everything.

    A remainder that does not fill a global batch is kept as a last, smaller global batch (the seed's Megatron
    path dropped it silently); the losses normalise it by its own counts.
    """
    if global_batch_size is not None and global_batch_size < 1:
        raise ValueError(f"train_global_batch_size must be >= 1 or None, got {global_batch_size}")
    size = num_samples if global_batch_size is None else global_batch_size
    return [range(start, min(start + size, num_samples)) for start in range(0, num_samples, max(size, 1))]


def shard_rows(rows: Sequence[int], rank: int, world_size: int) -> list[int]:
    """Rank `rank`'s contiguous share of `rows`; shares differ in size by at most one and may be empty."""
    base, extra = divmod(len(rows), world_size)
    start = rank * base + min(rank, extra)
    return list(rows[start : start + base + (1 if rank < extra else 0)])


def pack_by_count(num_rows: int, micro_batch_size: int) -> list[list[int]]:
    """Positions 0..num_rows-1 in consecutive groups of `micro_batch_size` (the last may be smaller)."""
    if micro_batch_size < 1:
        raise ValueError(f"train_micro_batch_size must be >= 1, got {micro_batch_size}")
    return [
        list(range(start, min(start + micro_batch_size, num_rows))) for start in range(0, num_rows, micro_batch_size)
    ]


def pack_by_tokens(lengths: Sequence[int], max_tokens: int) -> list[list[int]]:
    """Consecutive positions packed so that each group's padded size, rows x longest row, stays <= max_tokens.

    Greedy in order (training order and determinism are kept; no sorting). A row longer than the budget gets a
    group of its own, since it cannot be split.
    """
    return _pack_in_order(lengths, max_tokens, lambda rows, longest, _total: rows * longest)


def pack_by_token_sum(lengths: Sequence[int], max_tokens: int) -> list[list[int]]:
    """Consecutive positions packed so that each group's real tokens, the sum of its lengths, stay <= max_tokens.

    The budget of a packed forward, which computes only real tokens. Greedy in order, like `pack_by_tokens`; a
    row longer than the budget gets a group of its own.
    """
    return _pack_in_order(lengths, max_tokens, lambda _rows, _longest, total: total)


def _pack_in_order(lengths: Sequence[int], max_tokens: int, cost: Callable[[int, int, int], int]) -> list[list[int]]:
    """Greedy in-order groups of positions: a row joins the current group unless the group's `cost(rows, longest
    row, total length)` with it would pass max_tokens (a group's first row always joins it)."""
    if max_tokens < 1:
        raise ValueError(f"max_tokens_per_microbatch must be >= 1, got {max_tokens}")
    groups: list[list[int]] = []
    current: list[int] = []
    longest = total = 0
    for position, length in enumerate(lengths):
        if current and cost(len(current) + 1, max(longest, length), total + length) > max_tokens:
            groups.append(current)
            current, longest, total = [], 0, 0
        current.append(position)
        longest = max(longest, length)
        total += length
    if current:
        groups.append(current)
    return groups


def microbatch_rows(
    rows: Sequence[int],
    lengths: Sequence[int],
    micro_batch_size: int,
    max_tokens_per_microbatch: int | None,
    packed: bool = False,
) -> list[list[int]]:
    """`rows` (step-batch indices) cut into micro-batches: by the token budget when one is set (real tokens when
    `packed`, else rows x longest row), else by count.

    lengths[i] is the length of step-batch row i (see `row_lengths`).
    """
    if max_tokens_per_microbatch is None:
        groups = pack_by_count(len(rows), micro_batch_size)
    elif packed:
        groups = pack_by_token_sum([lengths[row] for row in rows], max_tokens_per_microbatch)
    else:
        groups = pack_by_tokens([lengths[row] for row in rows], max_tokens_per_microbatch)
    return [[rows[position] for position in group] for group in groups]


@dataclass
class TokenTally:
    """Token positions the forwards computed (padding and loss-free stand-ins included) and the real tokens among
    them: their ratio is the padding overhead (`perf/padding_ratio`)."""

    computed: int = 0
    real: int = 0

    def add(self, attention_mask: torch.Tensor, packed: bool, stand_in: bool = False) -> None:
        """Count one forward over a trimmed micro-batch [b, s]: packed, it computes only the real tokens; padded,
        rows x columns. A stand-in (a rank's loss-free filler) computes but contributes no real token."""
        real = int(attention_mask.sum())
        self.computed += real if packed else attention_mask.numel()
        self.real += 0 if stand_in else real

    def take(self) -> tuple[int, int]:
        """(computed, real) so far, and reset to zero."""
        counts = (self.computed, self.real)
        self.computed = self.real = 0
        return counts


def trim_padding(batch: TrainBatch) -> TrainBatch:
    """The batch without the padding columns past its longest row (right padding): less compute, same result.

    Every [B, S] field is cut to the same columns; causal attention makes the kept positions independent of
    the dropped ones.
    """
    width = max(row_lengths(batch.attention_mask), default=0)
    if width == batch.seq_len:
        return batch
    width = max(width, 1)  # keep S >= 1 so an all-padding row (a data error upstream) still has a shape
    updates = {
        spec.name: value[:, :width]
        for spec in fields(batch)
        if isinstance(value := getattr(batch, spec.name), torch.Tensor)
        and value.dim() == 2
        and value.shape[1] == batch.seq_len
    }
    return batch.with_fields(**updates)


def split_microbatches(
    batch: TrainBatch, micro_batch_size: int, max_tokens_per_microbatch: int | None = None
) -> list[TrainBatch]:
    """The batch as trimmed micro-batches, cut as `microbatch_rows` cuts it."""
    groups = microbatch_rows(
        range(len(batch)), row_lengths(batch.attention_mask), micro_batch_size, max_tokens_per_microbatch
    )
    return [trim_padding(batch.select(group)) for group in groups]


def without_loss(batch: TrainBatch) -> TrainBatch:
    """A copy whose every mask is zero: a stand-in micro-batch that runs forward and backward but adds nothing.

    Data-parallel ranks must run the same number of forward/backward passes (each one holds collectives), so a
    rank with fewer micro-batches pads with these.
    """
    updates: dict[str, object] = {
        "token_mask": torch.zeros_like(batch.token_mask),
        "sample_mask": torch.zeros_like(batch.sample_mask),
    }
    if batch.critic_mask is not None:
        updates["critic_mask"] = torch.zeros_like(batch.critic_mask)
    if batch.critic_sample_mask is not None:
        updates["critic_sample_mask"] = torch.zeros_like(batch.critic_sample_mask)
    return batch.with_fields(**updates)
