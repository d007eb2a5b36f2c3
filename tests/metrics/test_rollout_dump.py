"""Rollout dumps: the per-token packing on a hand batch, group indices, optional keys and weights_only loading."""

import pytest
import torch

from asyncppo.metrics.rollout_dump import FORMAT_VERSION, write_rollout_dump
from asyncppo.types import MessageSpan, TrainBatch


def hand_batch(group_ids: list[int], **optional: torch.Tensor) -> TrainBatch:
    # 4 samples, prompt length 2. Policy tokens (token_mask 1):
    #   sample 0: positions 2, 3      sample 1: position 2
    #   sample 2: positions 2, 4 (position 3 is a tool token)      sample 3: positions 2, 3
    token_mask = torch.tensor([[0, 0, 1, 1, 0], [0, 0, 1, 0, 0], [0, 0, 1, 0, 1], [0, 0, 1, 1, 0]], dtype=torch.float32)
    lengths = [4, 3, 5, 4]
    return TrainBatch(
        input_ids=torch.tensor([[10, 11, 12, 13, 0], [10, 11, 14, 0, 0], [20, 21, 22, 23, 24], [20, 21, 25, 26, 0]]),
        attention_mask=torch.tensor([[1] * n + [0] * (5 - n) for n in lengths]),
        token_mask=token_mask,
        generation_logprobs=-torch.arange(20, dtype=torch.float32).view(4, 5) / 10,
        rewards=torch.tensor([1.0, 0.0, 0.5, 0.0]),
        sample_mask=torch.tensor([1.0, 1.0, 0.0, 1.0]),
        group_ids=torch.tensor(group_ids),
        prompt_lengths=torch.tensor([2, 2, 2, 2]),
        truncated=torch.tensor([False, False, True, False]),
        policy_versions=torch.tensor([3, 3, 2, 2]),
        message_logs=tuple((MessageSpan("user", 2), MessageSpan("assistant", n - 2)) for n in lengths),
        old_logprobs=-torch.arange(20, dtype=torch.float32).view(4, 5) / 100,
        advantages=torch.arange(20, dtype=torch.float32).view(4, 5),
        **optional,
    )


def spelled(token_ids) -> str:
    """A fake tokenizer's decode: the ids, space-separated."""
    return " ".join(str(token_id) for token_id in token_ids)


def dump(tmp_path, batch: TrainBatch, **kwargs):
    arguments = {"num_generations_per_prompt": 2, "credit_level": "token", "adv_raw_mean": 0.5, "adv_raw_std": 2.0}
    path = write_rollout_dump(tmp_path / "dumps" / "rollout_dump_step4.pt", 4, batch, **(arguments | kwargs))
    return torch.load(path, weights_only=True)


def test_policy_tokens_are_packed_sample_by_sample(tmp_path):
    loaded = dump(tmp_path, hand_batch([7, 7, 9, 9]), decode=spelled)
    assert loaded["format_version"] == FORMAT_VERSION
    assert (loaded["step"], loaded["num_generations_per_prompt"], loaded["credit_level"]) == (4, 2, "token")
    assert (loaded["adv_raw_mean"], loaded["adv_raw_std"]) == (0.5, 2.0)
    # content: every real token of the sample (lengths 4, 3, 5, 4); token_text: the policy tokens one by one.
    assert loaded["content"] == ["10 11 12 13", "10 11 14", "20 21 22 23 24", "20 21 25 26"]
    assert loaded["token_text"] == ["12", "13", "14", "22", "24", "25", "26"]
    # Policy tokens (sample, position): (0,2) (0,3) (1,2) (2,2) (2,4) (3,2) (3,3).
    assert loaded["token_sample_index"].tolist() == [0, 0, 1, 2, 2, 3, 3]
    assert loaded["token_sequence_position"].tolist() == [2, 3, 2, 2, 4, 2, 3]
    assert loaded["token_response_position"].tolist() == [0, 1, 0, 0, 2, 0, 1]
    assert loaded["token_ids"].tolist() == [12, 13, 14, 22, 24, 25, 26]
    # advantages[i, t] = 5 i + t.
    assert loaded["advantages"].tolist() == [2.0, 3.0, 7.0, 12.0, 14.0, 17.0, 18.0]
    assert loaded["old_logprobs"] == pytest.approx([-0.02, -0.03, -0.07, -0.12, -0.14, -0.17, -0.18])
    assert loaded["generation_logprobs"] == pytest.approx([-0.2, -0.3, -0.7, -1.2, -1.4, -1.7, -1.8])
    assert loaded["sample_index"].tolist() == [0, 1, 2, 3]
    assert loaded["num_response_tokens"].tolist() == [2, 1, 2, 2]
    assert loaded["input_length"].tolist() == [4, 3, 5, 4]
    assert loaded["prompt_length"].tolist() == [2, 2, 2, 2]
    assert loaded["prompt_group_index"].tolist() == [0, 0, 1, 1]
    assert loaded["generation_index"].tolist() == [0, 1, 0, 1]
    assert loaded["sample_loss_mask"].tolist() == [1.0, 1.0, 0.0, 1.0]
    assert loaded["reward"].tolist() == [1.0, 0.0, 0.5, 0.0]
    assert loaded["truncated"].tolist() == [False, False, True, False]
    assert loaded["policy_version"].tolist() == [3, 3, 2, 2]


def test_group_indices_follow_group_ids_when_siblings_are_not_adjacent(tmp_path):
    loaded = dump(tmp_path, hand_batch([7, 9, 7, 9]))
    assert loaded["prompt_group_index"].tolist() == [0, 1, 0, 1]
    assert loaded["generation_index"].tolist() == [0, 0, 1, 1]


def test_optional_fields_are_absent_when_not_given(tmp_path):
    loaded = dump(tmp_path, hand_batch([7, 7, 9, 9]))
    for key in ("values", "returns", "reference_policy_logprobs", "is_anchor", "content", "token_text"):
        assert key not in loaded


def test_optional_fields_are_packed_when_given(tmp_path):
    ones = torch.ones(4, 5)
    batch = hand_batch([7, 7, 9, 9], values=ones * 0.5, returns=ones, reference_logprobs=-ones)
    anchor_mask = torch.zeros(4, 5, dtype=torch.bool)
    anchor_mask[:, 2] = True  # turn mode: the first token of each (single) assistant turn
    loaded = dump(tmp_path, batch, credit_level="turn", anchor_mask=anchor_mask)
    assert loaded["values"].tolist() == [0.5] * 7
    assert loaded["returns"].tolist() == [1.0] * 7
    assert loaded["reference_policy_logprobs"].tolist() == [-1.0] * 7
    assert loaded["is_anchor"].tolist() == [True, False, True, True, False, True, False]


def test_bad_dump_requests_are_rejected(tmp_path):
    batch = hand_batch([7, 7, 9, 9])
    with pytest.raises(ValueError, match="advantages"):
        dump(tmp_path, batch.with_fields(advantages=None))
    with pytest.raises(ValueError, match="anchor_mask"):
        dump(tmp_path, batch, credit_level="turn")
    assert not (tmp_path / "dumps").exists() or not any((tmp_path / "dumps").iterdir())
