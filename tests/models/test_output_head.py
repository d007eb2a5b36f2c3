"""head_token_logprobs: values and gradients equal a full-vocabulary log_softmax reference, chunked."""

from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from torch.nn import functional

from asyncppo.models.backbone import last_hidden_states
from asyncppo.models.output_head import head_token_logprobs
from asyncppo.models.policy import load_policy, token_logprobs

HIDDEN_SIZE = 8
VOCAB_SIZE = 13


def random_head(
    num_positions: int, with_bias: bool, dtype: torch.dtype = torch.float32, device: str = "cpu"
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, torch.Tensor]:
    """Fresh (hidden [N, H], weight [V, H], bias [V] or None, targets [N]), every float tensor a grad-requiring leaf."""
    hidden = torch.randn(num_positions, HIDDEN_SIZE, dtype=dtype, device=device, requires_grad=True)
    # Scaled by 1/sqrt(H) so the logits have unit variance, as a trained head's roughly do.
    weight = (torch.randn(VOCAB_SIZE, HIDDEN_SIZE, dtype=dtype, device=device) / HIDDEN_SIZE**0.5).requires_grad_(True)
    bias = torch.randn(VOCAB_SIZE, dtype=dtype, device=device, requires_grad=True) if with_bias else None
    targets = torch.randint(0, VOCAB_SIZE, (num_positions,), device=device)
    return hidden, weight, bias, targets


def reference_logprobs(
    hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, targets: torch.Tensor, temperature: float
) -> torch.Tensor:
    """The plain version: full [N, V] fp32 logits, log_softmax, gather."""
    logits = functional.linear(hidden, weight, bias).float() / temperature
    return torch.log_softmax(logits, dim=-1).gather(-1, targets.unsqueeze(-1)).squeeze(-1)


def relative_error(actual: torch.Tensor, expected: torch.Tensor) -> float:
    return ((actual.float() - expected.float()).norm() / expected.float().norm()).item()


# (N, chunk_size): N a multiple of the chunk, N not a multiple (a ragged last chunk), N below one chunk.
SHAPES = [(12, 4), (10, 4), (3, 8)]


@pytest.mark.parametrize(("num_positions", "chunk_size"), SHAPES)
@pytest.mark.parametrize("temperature", [0.7, 1.0])
@pytest.mark.parametrize("with_bias", [True, False])
def test_values_equal_the_full_log_softmax(num_positions: int, chunk_size: int, temperature: float, with_bias: bool):
    hidden, weight, bias, targets = random_head(num_positions, with_bias)
    logprobs = head_token_logprobs(hidden, weight, bias, targets, temperature, chunk_size)
    assert logprobs.shape == (num_positions,) and logprobs.dtype == torch.float32
    torch.testing.assert_close(
        logprobs, reference_logprobs(hidden, weight, bias, targets, temperature), atol=1e-6, rtol=1e-6
    )


def test_values_equal_the_unfused_chunk_bit_for_bit():
    # policy's checkpointed chunk computes linear -> float -> / T -> gather - logsumexp per chunk; the same ops on the
    # same rows must give the same bits, so switching implementations leaves old and new logprobs identical.
    hidden, weight, bias, targets = random_head(10, with_bias=True)
    expected = []
    for start in range(0, 10, 4):
        logits = functional.linear(hidden[start : start + 4], weight, bias).float() / 0.7
        gathered = logits.gather(-1, targets[start : start + 4].unsqueeze(-1)).squeeze(-1)
        expected.append(gathered - torch.logsumexp(logits, dim=-1))
    assert torch.equal(head_token_logprobs(hidden, weight, bias, targets, 0.7, 4), torch.cat(expected))


def test_a_two_token_head_by_hand():
    # hidden = [1], weight rows [1] and [0], T = 1: logits (1, 0), softmax (e/(e+1), 1/(e+1)).
    # Target 0: logprob = 1 - log(e + 1) = -0.31326; d/dhidden = (1 - e/(e+1)) * 1 + (0 - 1/(e+1)) * 0 = 1/(e+1).
    # At T = 2 the logits halve to (0.5, 0): logprob = 0.5 - log(e^0.5 + 1) = -0.47408, and
    # d/dhidden = (1 - e^0.5/(e^0.5+1)) / 2 = 1 / (2 (e^0.5 + 1)) = 0.18877.
    e = torch.e
    for temperature, expected_logprob, expected_grad in [
        (1.0, 1 - torch.log(torch.tensor(e + 1)).item(), 1 / (e + 1)),
        (2.0, 0.5 - torch.log(torch.tensor(e**0.5 + 1)).item(), 1 / (2 * (e**0.5 + 1))),
    ]:
        hidden = torch.tensor([[1.0]], requires_grad=True)
        weight = torch.tensor([[1.0], [0.0]])
        logprob = head_token_logprobs(hidden, weight, None, torch.tensor([0]), temperature, 1)
        logprob.sum().backward()
        assert hidden.grad is not None
        assert logprob.item() == pytest.approx(expected_logprob, abs=1e-6)
        assert hidden.grad.item() == pytest.approx(expected_grad, abs=1e-6)


def test_a_one_token_vocabulary_gives_logprob_zero():
    # With V = 1 the softmax is 1 whatever the logit, so logprob = log 1 = 0 and every gradient is 0 (onehot - 1 = 0).
    hidden = torch.randn(5, 3, requires_grad=True)
    weight = torch.randn(1, 3, requires_grad=True)
    logprobs = head_token_logprobs(hidden, weight, None, torch.zeros(5, dtype=torch.long), 0.7, 2)
    logprobs.sum().backward()
    assert torch.equal(logprobs.detach(), torch.zeros(5))
    assert hidden.grad is not None and weight.grad is not None
    assert torch.equal(hidden.grad, torch.zeros(5, 3)) and torch.equal(weight.grad, torch.zeros(1, 3))


@pytest.mark.parametrize(("num_positions", "chunk_size"), SHAPES)
@pytest.mark.parametrize("temperature", [0.7, 1.0])
@pytest.mark.parametrize("with_bias", [True, False])
def test_gradients_equal_autograd_through_the_reference(
    num_positions: int, chunk_size: int, temperature: float, with_bias: bool
):
    hidden, weight, bias, targets = random_head(num_positions, with_bias)
    leaves = [tensor for tensor in (hidden, weight, bias) if tensor is not None]
    upstream = torch.randn(num_positions)  # an arbitrary dL/dlogprob, not just ones
    fused = torch.autograd.grad(
        (head_token_logprobs(hidden, weight, bias, targets, temperature, chunk_size) * upstream).sum(), leaves
    )
    expected = torch.autograd.grad(
        (reference_logprobs(hidden, weight, bias, targets, temperature) * upstream).sum(), leaves
    )
    for actual, reference in zip(fused, expected, strict=True):
        assert actual.dtype == reference.dtype and actual.shape == reference.shape
        assert relative_error(actual, reference) <= 1e-5


def test_only_the_gradients_asked_for_are_computed():
    # A frozen head (weight and bias without grad) still passes the gradient on to hidden.
    hidden, weight, bias, targets = random_head(7, with_bias=True)
    weight.requires_grad_(False)
    assert bias is not None
    bias.requires_grad_(False)
    head_token_logprobs(hidden, weight, bias, targets, 0.7, 3).sum().backward()
    reference_hidden = hidden.detach().clone().requires_grad_(True)
    reference_logprobs(reference_hidden, weight, bias, targets, 0.7).sum().backward()
    assert weight.grad is None and bias.grad is None and hidden.grad is not None
    assert reference_hidden.grad is not None and relative_error(hidden.grad, reference_hidden.grad) <= 1e-5


def test_a_tied_weight_gets_the_embedding_and_the_head_gradients():
    # hidden = tanh(embedding(input_ids) @ mix): the weight feeds both the lookup and the head, so its gradient is
    # the sum of the two paths, which autograd adds up on its own.
    weight = torch.randn(VOCAB_SIZE, HIDDEN_SIZE, requires_grad=True)
    mix = torch.randn(HIDDEN_SIZE, HIDDEN_SIZE, requires_grad=True)
    input_ids = torch.randint(0, VOCAB_SIZE, (9,))
    targets = torch.randint(0, VOCAB_SIZE, (9,))
    upstream = torch.randn(9)

    def loss(logprob_function: Callable[[torch.Tensor], torch.Tensor]) -> torch.Tensor:
        hidden = torch.tanh(functional.embedding(input_ids, weight) @ mix)
        return (logprob_function(hidden) * upstream).sum()

    fused = torch.autograd.grad(
        loss(lambda hidden: head_token_logprobs(hidden, weight, None, targets, 0.7, 4)), (weight, mix)
    )
    expected = torch.autograd.grad(
        loss(lambda hidden: reference_logprobs(hidden, weight, None, targets, 0.7)), (weight, mix)
    )
    for actual, reference in zip(fused, expected, strict=True):
        assert relative_error(actual, reference) <= 1e-5


def test_a_tied_hugging_face_head_matches_token_logprobs(tiny_dir: Path):
    # The tiny model ties lm_head.weight to the input embedding; fed its hidden states and
    # get_output_embeddings().weight, the function gives token_logprobs' values bit for bit and its gradients.
    policy = load_policy(tiny_dir)
    head = policy.get_output_embeddings()
    assert isinstance(head, torch.nn.Linear) and head.weight is policy.get_input_embeddings().weight
    input_ids = torch.randint(9, 300, (2, 7))
    attention_mask = torch.ones(2, 7, dtype=torch.long)
    upstream = torch.randn(2, 6)

    expected = token_logprobs(policy, input_ids, attention_mask, 0.7, chunk_size=5)[:, 1:]
    (expected * upstream).sum().backward()
    expected_grads = {name: parameter.grad for name, parameter in policy.named_parameters()}
    policy.zero_grad(set_to_none=True)

    hidden = last_hidden_states(policy, input_ids, attention_mask)[:, :-1].reshape(-1, head.in_features)
    fused = head_token_logprobs(hidden, head.weight, head.bias, input_ids[:, 1:].reshape(-1), 0.7, 5).view(2, 6)
    (fused * upstream).sum().backward()
    assert torch.equal(fused.detach(), expected.detach())
    for name, parameter in policy.named_parameters():
        reference = expected_grads[name]
        assert parameter.grad is not None and reference is not None, name
        assert relative_error(parameter.grad, reference) <= 1e-5, name


def test_no_grad_builds_no_graph():
    hidden, weight, bias, targets = random_head(10, with_bias=True)
    with torch.no_grad():
        logprobs = head_token_logprobs(hidden, weight, bias, targets, 0.7, 4)
    assert not logprobs.requires_grad and logprobs.grad_fn is None
    torch.testing.assert_close(logprobs, reference_logprobs(hidden, weight, bias, targets, 0.7), atol=1e-6, rtol=1e-6)


def test_inputs_without_grad_build_no_graph():
    hidden, weight, bias, targets = random_head(10, with_bias=True)
    assert bias is not None
    logprobs = head_token_logprobs(hidden.detach(), weight.detach(), bias.detach(), targets, 0.7, 4)
    assert logprobs.grad_fn is None


def test_bf16_values_stay_within_bf16_rounding_of_fp32():
    # bf16 keeps 8 significant bits: each input and each logit moves by up to 2^-9 = 0.2% of itself. With
    # unit-variance logits / 0.7 that is about 0.01 per logit, and a logprob (logit - logsumexp) sums two such.
    hidden, weight, bias, targets = random_head(10, with_bias=True)
    assert bias is not None
    expected = reference_logprobs(hidden, weight, bias, targets, 0.7)
    low = head_token_logprobs(hidden.bfloat16(), weight.bfloat16(), bias.bfloat16(), targets, 0.7, 4)
    assert low.dtype == torch.float32
    torch.testing.assert_close(low, expected, atol=0.05, rtol=0.01)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"temperature": 0.0}, "temperature must be > 0, got 0.0"),
        ({"chunk_size": 0}, "chunk_size must be >= 1, got 0"),
        ({"hidden": torch.zeros(4, HIDDEN_SIZE + 1)}, r"same H, got \(4, 9\) and \(13, 8\)"),
        ({"hidden": torch.zeros(4, HIDDEN_SIZE, dtype=torch.bfloat16)}, "must share the model's dtype"),
        ({"bias": torch.zeros(VOCAB_SIZE + 1)}, r"bias must be \[V\] = \[13\], got \(14,\)"),
        ({"targets": torch.zeros(5, dtype=torch.long)}, r"targets must be \[N\] = \[4\] long, got \(5,\)"),
        ({"targets": torch.zeros(4, dtype=torch.int32)}, "torch.int32"),
    ],
)
def test_bad_arguments_name_the_offending_value(change: dict, message: str):
    arguments = {
        "hidden": torch.zeros(4, HIDDEN_SIZE),
        "weight": torch.zeros(VOCAB_SIZE, HIDDEN_SIZE),
        "bias": None,
        "targets": torch.zeros(4, dtype=torch.long),
        "temperature": 0.7,
        "chunk_size": 2,
    }
    with pytest.raises(ValueError, match=message):
        head_token_logprobs(**(arguments | change))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_a_qwen_sized_bf16_head_on_cuda_matches_fp32_without_an_n_by_v_buffer():
    # Qwen2.5-0.5B's head (V = 151,936, H = 896), N = 4096 positions. A [N, V] fp32 tensor is 2.5 GB; the
    # chunked pass may hold the fp32 [V, H] weight-gradient accumulator (0.54 GB) plus a few [C, V] chunks.
    num_positions, vocab_size, hidden_size, chunk_size = 4096, 151_936, 896, 512
    generator = torch.Generator(device="cuda").manual_seed(0)
    hidden = torch.randn(num_positions, hidden_size, device="cuda", generator=generator)
    weight = torch.randn(vocab_size, hidden_size, device="cuda", generator=generator) / hidden_size**0.5
    targets = torch.randint(0, vocab_size, (num_positions,), device="cuda", generator=generator)
    upstream = torch.randn(num_positions, device="cuda", generator=generator)

    hidden_bf16 = hidden.bfloat16().requires_grad_(True)
    weight_bf16 = weight.bfloat16().requires_grad_(True)
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    baseline = torch.cuda.memory_allocated()
    logprobs = head_token_logprobs(hidden_bf16, weight_bf16, None, targets, 0.7, chunk_size)
    (logprobs * upstream).sum().backward()
    torch.cuda.synchronize()
    extra = torch.cuda.max_memory_allocated() - baseline
    assert extra < num_positions * vocab_size * 4 * 0.5, f"peak extra memory {extra / 2**30:.2f} GiB"

    # The reference starts from the bf16-rounded inputs, so only the bf16 arithmetic differs.
    hidden_reference = hidden_bf16.detach().float().requires_grad_(True)
    weight_reference = weight_bf16.detach().float().requires_grad_(True)
    expected = reference_logprobs(hidden_reference, weight_reference, None, targets, 0.7)
    (expected * upstream).sum().backward()
    assert relative_error(logprobs.detach(), expected.detach()) <= 1e-2
    assert hidden_bf16.grad is not None and hidden_reference.grad is not None
    assert weight_bf16.grad is not None and weight_reference.grad is not None
    assert relative_error(hidden_bf16.grad, hidden_reference.grad) <= 1e-2
    assert relative_error(weight_bf16.grad, weight_reference.grad) <= 1e-2
