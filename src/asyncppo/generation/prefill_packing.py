"""Packing a graph-engine prefill step: the scheduler's chunks as the device tensors the runner's forward reads.

`GraphRunner.prefill` (`generation/graph_runner.py`) calls these; `GraphEngine` builds the PrefillChunks.
Letters: as in `generation/decoder_forward.py` (T packed tokens, N rows, P longest chunk).

    chunks --packed_token_columns--> [token ids, positions, slots] of T packed tokens (padding: the sink slot)
           --query_block_table-----> the Triton kernel's query blocks (static inputs of a captured graph)
           --padded_prefill_batch--> the eager path's PrefillBatch (SDPA over a padded gather)
           --prefill_sampling------> sampling settings and packed index of each row that samples its next token
"""

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from asyncppo.generation.decoder_forward import PrefillBatch, prefill_mask
from asyncppo.generation.graph_sampling import SamplingRows
from asyncppo.generation.prefill_attention import max_query_blocks, query_blocks


@dataclass(frozen=True)
class PrefillChunk:
    """One row of a prefill step: compute `token_ids` at positions start..start+len-1 of `slot`."""

    slot: int
    token_ids: tuple[int, ...]
    start: int
    sample: bool
    """True when the chunk ends the row's context: the next token is sampled from its last position."""
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    greedy: bool = False
    seed: int = 0


def prefill_buckets(max_tokens: int) -> tuple[int, ...]:
    """Packed-token counts of prefill graphs: 64, 128, then steps of x1.5 / x1.33 (256, 384, 512, 768, ...) up to
    max_tokens rounded up to 64, so a step pads at most half of its tokens (a third past 256)."""
    top = max(64, -(-max_tokens // 64) * 64)
    sizes, size = {64, 128}, 256
    while size < top:
        sizes |= {size, size * 3 // 2}
        size *= 2
    return tuple(sorted({s for s in sizes if s < top} | {top}))


def packed_token_columns(chunks: Sequence[PrefillChunk], num_tokens: int, sink: int) -> list[list[int]]:
    """[token ids, positions, cache slots] of the chunks' tokens packed in order, padded to `num_tokens` with
    token 0 at position 0 of the `sink` slot (padding writes only there)."""
    padding = num_tokens - sum(len(chunk.token_ids) for chunk in chunks)
    return [
        [token for chunk in chunks for token in chunk.token_ids] + [0] * padding,
        [chunk.start + i for chunk in chunks for i in range(len(chunk.token_ids))] + [0] * padding,
        [chunk.slot for chunk in chunks for _ in chunk.token_ids] + [sink] * padding,
    ]


def query_block_table(
    chunks: Sequence[PrefillChunk], num_tokens: int, sink: int, block_tokens: int, max_chunks: int
) -> torch.Tensor:
    """[max_query_blocks, 3] long (CPU): the Triton prefill kernel's query blocks for the chunks packed into
    `num_tokens` tokens, unused blocks zero (a token count of 0 skips them)."""
    blocks = query_blocks(
        [len(chunk.token_ids) for chunk in chunks], [chunk.slot for chunk in chunks], num_tokens, sink, block_tokens
    )
    table = torch.zeros(max_query_blocks(num_tokens, max_chunks, block_tokens), 3, dtype=torch.long)
    table[: len(blocks)] = torch.tensor(blocks, dtype=torch.long)
    return table


def padded_prefill_batch(
    chunks: Sequence[PrefillChunk], sink: int, max_positions: int, device: torch.device
) -> PrefillBatch:
    """The eager path's PrefillBatch: packed tokens padded to a multiple of 8 (at least 8), since a compiled step
    would specialise a second time on a single row, and keys up to the longest context rounded up to 16."""
    lengths = [len(chunk.token_ids) for chunk in chunks]
    width = max(lengths)
    padded_index = torch.zeros(len(chunks), width, dtype=torch.long)
    packed_index, offset = [], 0
    for row, length in enumerate(lengths):
        padded_index[row, :length] = torch.arange(offset, offset + length)
        packed_index.extend(range(row * width, row * width + length))
        offset += length
    ends = [chunk.start + length for chunk, length in zip(chunks, lengths, strict=True)]
    key_length = min(-(-max(ends) // 16) * 16, max_positions)

    def tensor(values: list[int]) -> torch.Tensor:
        return torch.tensor(values, dtype=torch.long, device=device)

    token_ids, positions, token_slots = packed_token_columns(chunks, max(8, -(-offset // 8) * 8), sink)
    return PrefillBatch(
        token_ids=tensor(token_ids),
        positions=tensor(positions),
        token_slots=tensor(token_slots),
        slots=tensor([chunk.slot for chunk in chunks]),
        padded_index=padded_index.to(device),
        packed_index=tensor(packed_index),
        mask=prefill_mask(tensor([chunk.start for chunk in chunks]), tensor(ends), width, key_length),
        key_length=key_length,
    )


def prefill_sampling(chunks: Sequence[PrefillChunk], device: torch.device) -> tuple[SamplingRows, torch.Tensor]:
    """The sampling settings of the chunks with `sample` (in order), and the packed index of each one's last token.

    A sampled token's index in its sequence (start + chunk length) keys its noise, as in the decode step. One
    host-to-device copy each for the integer and the float columns."""
    sampling = [chunk for chunk in chunks if chunk.sample]
    ends = torch.tensor([len(chunk.token_ids) for chunk in chunks], dtype=torch.long).cumsum(0) - 1
    integers = torch.tensor(
        [[c.top_k, int(c.greedy), c.seed, c.start + len(c.token_ids)] for c in sampling], dtype=torch.long
    )
    integers = torch.cat([integers, ends[[i for i, c in enumerate(chunks) if c.sample]][:, None]], dim=1)
    top_k, greedy, seeds, positions, last = integers.to(device).unbind(1)
    floats = torch.tensor([[c.temperature, c.top_p] for c in sampling], dtype=torch.float32).to(device)
    return SamplingRows(floats[:, 0], floats[:, 1], top_k, greedy.bool(), seeds, positions), last
