"""Cutting a step batch: global batches keep their remainder, ranks share rows, micro-batches by count or tokens."""

import pytest
import torch
from worker_fakes import make_batch

from asyncppo.workers.microbatches import (
    TokenTally,
    global_batch_rows,
    microbatch_rows,
    pack_by_token_sum,
    pack_by_tokens,
    row_lengths,
    shard_rows,
    split_microbatches,
    trim_padding,
    without_loss,
)


def test_global_batches_keep_the_remainder_as_a_last_smaller_batch() -> None:
    assert global_batch_rows(5, 2) == [range(0, 2), range(2, 4), range(4, 5)]
    assert global_batch_rows(4, 2) == [range(0, 2), range(2, 4)]
    assert global_batch_rows(3, 8) == [range(0, 3)]
    assert global_batch_rows(3, None) == [range(0, 3)]
    with pytest.raises(ValueError, match="train_global_batch_size"):
        global_batch_rows(3, 0)


def test_ranks_share_rows_contiguously_and_differ_by_at_most_one() -> None:
    rows = range(10, 15)
    shares = [shard_rows(rows, rank, 3) for rank in range(3)]
    assert shares == [[10, 11], [12, 13], [14]]
    assert [shard_rows(range(1), rank, 2) for rank in range(2)] == [[0], []]


def test_token_packing_keeps_padded_size_within_budget_and_isolates_long_rows() -> None:
    # Budget 20, lengths 8 12 10 6 12 7 25:
    # [8] + 12 -> 2 x 12 = 24 > 20, close; [12] + 10 -> 24, close; [10] + 6 -> 20 ok, + 12 -> 36, close;
    # [12] + 7 -> 24, close; [7] + 25 -> 50, close; [25] alone (longer than the budget).
    lengths = [8, 12, 10, 6, 12, 7, 25]
    groups = pack_by_tokens(lengths, 20)
    assert groups == [[0], [1], [2, 3], [4], [5], [6]]
    for group in groups:
        padded = len(group) * max(lengths[i] for i in group)
        assert padded <= 20 or len(group) == 1
    assert pack_by_tokens([4, 4, 4, 4, 4], 12) == [[0, 1, 2], [3, 4]]


def test_microbatch_rows_map_back_to_step_batch_indices() -> None:
    lengths = [5, 5, 9, 3, 3, 3]
    assert microbatch_rows(range(2, 6), lengths, 3, None) == [[2, 3, 4], [5]]
    # By tokens (budget 9) the count is ignored: [9] alone, then 3 rows of 3.
    assert microbatch_rows(range(2, 6), lengths, 1, 9) == [[2], [3, 4, 5]]


def test_trimming_cuts_every_per_position_field_to_the_longest_row() -> None:
    batch = make_batch([5, 9, 4])
    batch = batch.with_fields(old_logprobs=torch.randn(3, 9), values=torch.randn(3, 9))
    sub = trim_padding(batch.select([0, 2]))
    assert row_lengths(batch.attention_mask) == [5, 9, 4]
    assert sub.seq_len == 5
    for name in ("input_ids", "attention_mask", "token_mask", "generation_logprobs", "old_logprobs", "values"):
        assert torch.equal(getattr(sub, name), getattr(batch, name)[[0, 2], :5])
    assert torch.equal(sub.rewards, batch.rewards[[0, 2]])


def test_split_microbatches_covers_each_row_once_in_order() -> None:
    batch = make_batch([6, 8, 7, 5, 8])
    micro = split_microbatches(batch, 2)
    assert [len(m) for m in micro] == [2, 2, 1]
    assert [m.seq_len for m in micro] == [8, 7, 8]  # rows (7, 5) need 7 columns
    assert torch.equal(torch.cat([m.input_ids[:, :5] for m in micro]), batch.input_ids[:, :5])
    # Budget 15 over lengths 6 8 7 5 8: [6] + 8 -> 2 x 8 = 16 closes; [8] + 7 -> 16 closes; [7, 5] (2 x 7 = 14),
    # + 8 -> 24 closes; [8]. Each micro-batch is trimmed to its own longest row.
    by_tokens = split_microbatches(batch, 1, max_tokens_per_microbatch=15)
    assert [len(m) for m in by_tokens] == [1, 1, 2, 1]
    assert [m.seq_len for m in by_tokens] == [6, 8, 7, 8]


def test_a_real_token_budget_packs_more_rows_than_a_padded_one() -> None:
    # Budget 15 over lengths 6 8 7 5 8, summing real tokens: 6 + 8 = 14, + 7 > 15 closes; 7 + 5 = 12, + 8 > 15
    # closes; [8]. The padded budget cut the same rows into four micro-batches (rows x longest row).
    lengths = [6, 8, 7, 5, 8]
    assert pack_by_token_sum(lengths, 15) == [[0, 1], [2, 3], [4]]
    assert microbatch_rows([10, 11, 12, 13, 14], [0] * 10 + lengths, 1, 15, packed=True) == [[10, 11], [12, 13], [14]]
    assert pack_by_token_sum([20, 3], 15) == [[0], [1]]  # a row over the budget runs alone
    with pytest.raises(ValueError, match="max_tokens_per_microbatch"):
        pack_by_token_sum(lengths, 0)


def test_token_tally_counts_padding_and_stand_ins() -> None:
    # Rows of 3 and 1 real tokens in 4 columns: padded computes 2 x 4 = 8 positions, packed the 4 real ones; a
    # stand-in micro-batch computes without adding real tokens.
    mask = torch.tensor([[1, 1, 1, 0], [1, 0, 0, 0]])
    tally = TokenTally()
    tally.add(mask, packed=False)
    tally.add(mask, packed=True)
    tally.add(mask, packed=True, stand_in=True)
    assert tally.take() == (8 + 4 + 4, 4 + 4)
    assert tally.take() == (0, 0)


def test_a_loss_free_copy_zeroes_every_mask() -> None:
    batch = make_batch([4, 6]).with_fields(critic_mask=torch.ones(2, 6), critic_sample_mask=torch.ones(2))
    padding = without_loss(batch)
    for name in ("token_mask", "sample_mask", "critic_mask", "critic_sample_mask"):
        assert not getattr(padding, name).any()
    assert torch.equal(padding.input_ids, batch.input_ids)
