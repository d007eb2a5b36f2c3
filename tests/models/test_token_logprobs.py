"""token_logprobs: equal to a full-vocabulary log_softmax reference, chunked forward and backward."""

from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import PreTrainedModel

from asyncppo.models import output_head
from asyncppo.models.policy import load_policy, token_logprobs

TEMPERATURE = 0.7


@pytest.fixture
def policy(tiny_dir: Path) -> PreTrainedModel:
    return load_policy(tiny_dir)


def padded_batch() -> tuple[torch.Tensor, torch.Tensor]:
    """[3, 9] ids with one full row, one right-padded row and one left-padded row (B*S = 27, S-1 = 8)."""
    generator = torch.Generator().manual_seed(0)
    input_ids = torch.randint(9, 300, (3, 9), generator=generator)
    attention_mask = torch.ones(3, 9, dtype=torch.long)
    attention_mask[1, 6:] = 0
    attention_mask[2, :3] = 0
    input_ids[attention_mask == 0] = 0  # <|pad|>
    return input_ids, attention_mask


def reference_logprobs(
    model: PreTrainedModel, input_ids: torch.Tensor, attention_mask: torch.Tensor, temperature: float
) -> torch.Tensor:
    """The straightforward version: full [B, S, V] fp32 logits, log_softmax, gather, shift, mask."""
    position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)  # as generate() does for left padding
    logits = model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids).logits
    full = torch.log_softmax(logits.float() / temperature, dim=-1)  # [B, S, V]
    next_token = full[:, :-1].gather(-1, input_ids[:, 1:].unsqueeze(-1)).squeeze(-1)
    shifted = torch.cat([torch.zeros_like(next_token[:, :1]), next_token], dim=1)
    return shifted * attention_mask


@pytest.mark.parametrize("chunk_size", [1, 5, 8, 24, 1024])  # 5 divides neither 24 predicting positions nor B*S
def test_chunked_logprobs_equal_the_full_log_softmax_reference(policy: PreTrainedModel, chunk_size: int) -> None:
    input_ids, attention_mask = padded_batch()
    with torch.no_grad():
        expected = reference_logprobs(policy, input_ids, attention_mask, TEMPERATURE)
        actual = token_logprobs(policy, input_ids, attention_mask, TEMPERATURE, chunk_size=chunk_size)
    assert actual.dtype == torch.float32 and actual.shape == input_ids.shape
    torch.testing.assert_close(actual, expected, rtol=1e-5, atol=0.0)
    assert torch.all(actual[:, 0] == 0)
    assert torch.all(actual[attention_mask == 0] == 0)
    assert torch.all(actual[:, 1:][attention_mask[:, 1:] == 1] < 0)


def test_temperature_divides_the_logits_before_the_softmax(policy: PreTrainedModel) -> None:
    input_ids, attention_mask = padded_batch()
    with torch.no_grad():
        at_one = token_logprobs(policy, input_ids, attention_mask, temperature=1.0)
        at_point_seven = token_logprobs(policy, input_ids, attention_mask, temperature=TEMPERATURE)
        torch.testing.assert_close(
            at_one, reference_logprobs(policy, input_ids, attention_mask, 1.0), rtol=1e-5, atol=0
        )
    assert not torch.allclose(at_one, at_point_seven)


@pytest.mark.parametrize("chunk_size", [5, 1024])
def test_chunked_logprob_gradients_equal_the_reference_gradients(policy: PreTrainedModel, chunk_size: int) -> None:
    input_ids, attention_mask = padded_batch()
    weights = torch.randn(input_ids.shape, generator=torch.Generator().manual_seed(1))

    def gradients(logprobs_fn) -> dict[str, torch.Tensor]:
        policy.zero_grad(set_to_none=True)
        (logprobs_fn() * weights).sum().backward()
        return {name: p.grad.clone() for name, p in policy.named_parameters() if p.grad is not None}

    expected = gradients(lambda: reference_logprobs(policy, input_ids, attention_mask, TEMPERATURE))
    actual = gradients(lambda: token_logprobs(policy, input_ids, attention_mask, TEMPERATURE, chunk_size=chunk_size))
    assert actual.keys() == expected.keys() == {name for name, _ in policy.named_parameters()}
    for name, gradient in expected.items():
        # Summation order differs (chunks, logsumexp vs log_softmax), so entries near zero carry fp32 noise of
        # the tensor's scale: bound the error by 1e-6 of the largest entry, plus 1e-5 relative.
        scale = gradient.abs().max().item()
        torch.testing.assert_close(
            actual[name], gradient, rtol=1e-5, atol=1e-6 * scale, msg=lambda m, n=name: f"{n}: {m}"
        )


def test_output_head_sees_at_most_chunk_size_positions_forward_and_backward(
    policy: PreTrainedModel, monkeypatch: pytest.MonkeyPatch
) -> None:
    input_ids, attention_mask = padded_batch()
    rows_per_call: list[int] = []
    chunk_logits = output_head._chunk_logits  # pyright: ignore[reportPrivateUsage]

    def recording_chunk_logits(hidden: torch.Tensor, *args: Any) -> torch.Tensor:
        rows_per_call.append(hidden.shape[0])
        return chunk_logits(hidden, *args)

    monkeypatch.setattr(output_head, "_chunk_logits", recording_chunk_logits)
    logprobs = token_logprobs(policy, input_ids, attention_mask, TEMPERATURE, chunk_size=5)
    forward_calls = len(rows_per_call)
    logprobs.sum().backward()
    # 3 rows x 8 predicting positions = 24 positions -> chunks of 5, 5, 5, 5, 4; backward recomputes each chunk once.
    assert rows_per_call[:forward_calls] == [5, 5, 5, 5, 4]
    assert sorted(rows_per_call[forward_calls:]) == [4, 5, 5, 5, 5]


def test_single_token_sequences_hold_zero(policy: PreTrainedModel) -> None:
    with torch.no_grad():
        logprobs = token_logprobs(policy, torch.tensor([[5], [6]]), torch.ones(2, 1, dtype=torch.long), 1.0)
    assert torch.equal(logprobs, torch.zeros(2, 1))


def test_invalid_temperature_is_rejected(policy: PreTrainedModel) -> None:
    input_ids, attention_mask = padded_batch()
    with pytest.raises(ValueError, match="temperature"):
        token_logprobs(policy, input_ids, attention_mask, temperature=0.0)


def test_an_unhandled_final_logit_softcap_raises_not_implemented(policy: PreTrainedModel) -> None:
    input_ids, attention_mask = padded_batch()
    policy.config.final_logit_softcapping = 30.0
    with pytest.raises(NotImplementedError, match="final_logit_softcapping"):
        token_logprobs(policy, input_ids, attention_mask, TEMPERATURE)
