"""Padding-free layout of a batch: every row's real tokens back to back in one packed row.

The training and scoring forwards (`policy.token_logprobs`, `value.values` with `packed=True`) pack a padded
micro-batch, run the backbone once over the packed row with attention kept inside each sequence
(`models/varlen_attention.py`) and positions restarting at 0 per sequence, then scatter the per-token results back
into the padded [B, S] layout the losses read. Only real tokens reach the matmuls, so a long-tailed batch costs
what its tokens cost, not rows x longest row.

    padded [B, S]  (attention_mask 1 = real)        packed [T] (T = real tokens)
    a a a . .                                       a a a b b b b c
    b b b b .      --pack_rows-->  flat_index       positions 0 1 2 0 1 2 3 0
    c . . . .                                       cu_seq_lens [0, 3, 7, 8]

Letters: B rows, S positions, T packed tokens, N sequences (rows with at least one real token).
"""

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class PackedRows:
    """Where each real token of a padded batch sits in the packed row, and the sequence boundaries."""

    flat_index: torch.Tensor
    """[T] long: index of each packed token in the flattened [B * S] batch, in row-major order."""
    position_ids: torch.Tensor
    """[T] long: the token's position within its own sequence (0 at each sequence start)."""
    cu_seq_lens: torch.Tensor
    """[N + 1] int32: cumulative sequence lengths; sequence i occupies packed tokens cu[i] .. cu[i+1] - 1."""
    max_length: int
    """Longest sequence, in tokens."""
    batch_size: int
    seq_len: int

    @property
    def num_tokens(self) -> int:
        return int(self.flat_index.shape[0])

    def gather(self, padded: torch.Tensor) -> torch.Tensor:
        """[B, S, ...] -> [T, ...]: the real tokens' entries, packed."""
        return padded.reshape(self.batch_size * self.seq_len, *padded.shape[2:])[self.flat_index]

    def scatter(self, packed: torch.Tensor) -> torch.Tensor:
        """[T] -> [B, S]: each packed value at its padded place, 0 at padding."""
        out = packed.new_zeros(self.batch_size * self.seq_len)
        out[self.flat_index] = packed
        return out.view(self.batch_size, self.seq_len)

    def sequence_starts(self) -> torch.Tensor:
        """[T] bool: True at the first token of each sequence (it has no prediction)."""
        return self.position_ids == 0


def pack_rows(attention_mask: torch.Tensor) -> PackedRows:
    """The packed layout of a [B, S] attention mask (1 = real token, anywhere in the row).

    Positions count real tokens only (cumsum of the mask - 1), as `backbone.position_ids_from_mask` does for
    the padded forward, so a row's rotary positions are the same in both layouts (right padding, the trainer's
    layout, gives 0..L-1). One host sync reads the sequence lengths (the attention kernel needs the longest).
    """
    if attention_mask.dim() != 2:
        raise ValueError(f"attention_mask must be [B, S], got {tuple(attention_mask.shape)}")
    mask = attention_mask.bool()
    batch_size, seq_len = mask.shape
    lengths = mask.sum(dim=1)
    flat_index = mask.reshape(-1).nonzero().squeeze(-1)
    positions = (mask.long().cumsum(dim=1) - 1).reshape(-1)[flat_index]
    lengths_list = [length for length in lengths.tolist() if length > 0]
    cu_seq_lens = torch.zeros(len(lengths_list) + 1, dtype=torch.int32, device=attention_mask.device)
    if lengths_list:
        cu_seq_lens[1:] = torch.tensor(lengths_list, device=attention_mask.device).cumsum(0)
    return PackedRows(
        flat_index=flat_index,
        position_ids=positions,
        cu_seq_lens=cu_seq_lens,
        max_length=max(lengths_list, default=0),
        batch_size=batch_size,
        seq_len=seq_len,
    )
