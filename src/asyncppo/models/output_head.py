"""Per-token log-probabilities through the output head, chunked over positions, with a hand-written backward.

Called by `policy.token_logprobs` (policy logprobs for the PPO ratio, reference logprobs for the KL). Letters:
N predicting positions, H hidden size, V vocabulary, C chunk size (rows per chunk).

With z = (hidden @ weight.T + bias) / temperature (the matmul in the model's dtype, z in fp32) and t the target:

    logprob = z[t] - lse,    lse = log sum_j exp(z[j])
    d logprob / d (hidden @ weight.T + bias)[j] = (onehot(t)[j] - softmax(z)[j]) / temperature

The forward keeps only lse [N] for the backward; the backward recomputes one chunk of z at a time, turns it into
the gradient above in place, and feeds it to two matmuls. Peak extra memory is a few [C, V] fp32 tensors plus
an fp32 [V, H] accumulator for the weight's gradient, never an [N, V] tensor.
"""

from typing import Any

import torch
from torch.nn import functional


def _chunk_logits(
    hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, temperature: float
) -> torch.Tensor:
    """[C, V] fp32 logits / temperature; the head runs in the model's dtype, as the hf generator does."""
    # .float() is the cast the plain reference makes; dividing in place spares one [C, V] fp32 copy and gives the
    # same values (the same kernel as the out-of-place division).
    return functional.linear(hidden, weight, bias).float().div_(temperature)


def _chunked_forward(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    targets: torch.Tensor,
    temperature: float,
    chunk_size: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """([N] logprobs, [N] lse), both fp32, computed `chunk_size` rows at a time."""
    num_positions = hidden.shape[0]
    logprobs = torch.empty(num_positions, dtype=torch.float32, device=hidden.device)
    log_normalizers = torch.empty_like(logprobs)
    for start in range(0, num_positions, chunk_size):
        rows = slice(start, start + chunk_size)
        logits = _chunk_logits(hidden[rows], weight, bias, temperature)
        log_normalizer = torch.logsumexp(logits, dim=-1)
        # The same ops as policy's checkpointed chunk (gather minus logsumexp), so the values match it bit for bit.
        logprobs[rows] = logits.gather(-1, targets[rows].unsqueeze(-1)).squeeze(-1) - log_normalizer
        log_normalizers[rows] = log_normalizer
        del logits  # free this chunk's [C, V] before the next one is allocated
    return logprobs, log_normalizers


def _chunk_grad_logits(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    targets: torch.Tensor,
    log_normalizer: torch.Tensor,
    grad_logprobs: torch.Tensor,
    temperature: float,
) -> torch.Tensor:
    """[C, V] fp32 gradient with respect to the head's output: g * (onehot(target) - softmax(z)) / temperature."""
    # Every step works in place on the one recomputed [C, V] buffer: z -> softmax(z) -> -g/T * softmax(z).
    probabilities = _chunk_logits(hidden, weight, bias, temperature).sub_(log_normalizer.unsqueeze(-1)).exp_()
    scale = (grad_logprobs / temperature).unsqueeze(-1)  # [C, 1]
    grad_logits = probabilities.mul_(-scale)
    return grad_logits.scatter_add_(-1, targets.unsqueeze(-1), scale)


class _HeadTokenLogprobs(torch.autograd.Function):
    """Autograd wrapper around `_chunked_forward`; saves the inputs and lse [N], not the logits."""

    @staticmethod
    def forward(  # pyright: ignore[reportIncompatibleMethodOverride]: autograd's base takes *args
        ctx: Any,  # a FunctionCtx, which takes any attribute
        hidden: torch.Tensor,
        weight: torch.Tensor,
        bias: torch.Tensor | None,
        targets: torch.Tensor,
        temperature: float,
        chunk_size: int,
    ) -> torch.Tensor:
        logprobs, log_normalizers = _chunked_forward(hidden, weight, bias, targets, temperature, chunk_size)
        # save_for_backward (not attributes on ctx) so autograd checks that no input was modified in place before
        # the backward; under FSDP2 the weight saved here is the unsharded parameter, as it is for a plain linear.
        ctx.save_for_backward(hidden, weight, bias, targets, log_normalizers)
        ctx.temperature = temperature
        ctx.chunk_size = chunk_size
        return logprobs

    @staticmethod
    def backward(  # pyright: ignore[reportIncompatibleMethodOverride]: autograd's base takes *args
        ctx: Any, grad_logprobs: torch.Tensor
    ) -> tuple[torch.Tensor | None, torch.Tensor | None, torch.Tensor | None, None, None, None]:
        hidden, weight, bias, targets, log_normalizers = ctx.saved_tensors
        temperature: float = ctx.temperature
        chunk_size: int = ctx.chunk_size
        needs_hidden, needs_weight, needs_bias = ctx.needs_input_grad[:3]
        grad_logprobs = grad_logprobs.float()
        grad_hidden = hidden.new_empty(hidden.shape) if needs_hidden else None
        # fp32 accumulators: summing per-chunk bf16 contributions in bf16 would lose the small ones.
        grad_weight = weight.new_zeros(weight.shape, dtype=torch.float32) if needs_weight else None
        grad_bias = weight.new_zeros(weight.shape[0], dtype=torch.float32) if needs_bias else None
        for start in range(0, hidden.shape[0], chunk_size):
            rows = slice(start, start + chunk_size)
            grad_logits = _chunk_grad_logits(
                hidden[rows], weight, bias, targets[rows], log_normalizers[rows], grad_logprobs[rows], temperature
            )
            if grad_bias is not None:
                grad_bias += grad_logits.sum(dim=0)
            # One cast per chunk, then both matmuls run in the model's dtype (rebinding frees the fp32 buffer).
            grad_logits = grad_logits.to(weight.dtype)
            if grad_hidden is not None:
                grad_hidden[rows] = grad_logits @ weight
            if grad_weight is not None:
                grad_weight += grad_logits.T @ hidden[rows]
            del grad_logits
        return (
            grad_hidden,
            None if grad_weight is None else grad_weight.to(weight.dtype),
            None if grad_bias is None else grad_bias.to(bias.dtype),
            None,
            None,
            None,
        )


def _check_arguments(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    targets: torch.Tensor,
    temperature: float,
    chunk_size: int,
) -> None:
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
    if hidden.dim() != 2 or weight.dim() != 2 or hidden.shape[1] != weight.shape[1]:
        raise ValueError(
            f"hidden must be [N, H] and weight [V, H] with the same H, got {tuple(hidden.shape)} and "
            f"{tuple(weight.shape)}"
        )
    if hidden.dtype != weight.dtype:
        raise ValueError(f"hidden ({hidden.dtype}) and weight ({weight.dtype}) must share the model's dtype")
    if bias is not None and bias.shape != weight.shape[:1]:
        raise ValueError(f"bias must be [V] = [{weight.shape[0]}], got {tuple(bias.shape)}")
    if targets.shape != hidden.shape[:1] or targets.dtype != torch.long:
        raise ValueError(f"targets must be [N] = [{hidden.shape[0]}] long, got {tuple(targets.shape)} {targets.dtype}")


def head_token_logprobs(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    targets: torch.Tensor,
    temperature: float,
    chunk_size: int,
) -> torch.Tensor:
    """[N] fp32: log softmax((hidden @ weight.T + bias) / temperature)[targets] for N positions.

    Inputs: hidden [N, H] in the model's dtype, weight [V, H] (the output head's, possibly tied to the input
    embedding: autograd then adds both uses' gradients), bias [V] or None, targets [N] long. The head matmul runs
    in the model's dtype and is cast to fp32 before the temperature, so the values equal those of a plain
    `functional.linear(...).float() / temperature` followed by `gather - logsumexp`.

    With autograd on and any of hidden, weight, bias requiring grad, the backward is the chunked one of this
    module's docstring; otherwise only the chunked forward runs and no graph is built.
    """
    _check_arguments(hidden, weight, bias, targets, temperature, chunk_size)
    inputs_require_grad = any(tensor is not None and tensor.requires_grad for tensor in (hidden, weight, bias))
    if torch.is_grad_enabled() and inputs_require_grad:
        logprobs = _HeadTokenLogprobs.apply(hidden, weight, bias, targets, temperature, chunk_size)
        assert isinstance(logprobs, torch.Tensor)
        return logprobs
    return _chunked_forward(hidden, weight, bias, targets, temperature, chunk_size)[0]
