"""Attention over packed sequences for Hugging Face decoders: each token attends causally within its own sequence.

`use_packed_attention(model)` registers one attention implementation with transformers and switches the model to
it. A forward that passes `cu_seq_lens_q` (the packed layout of `models/packing.py`) runs varlen attention; any
other forward (padded scoring, generation with a KV cache on the same model) is handed to transformers' own SDPA
implementation with the mask SDPA would get, so nothing else about the model changes.

The packed kernel is chosen explicitly, never by a dispatcher per shape:
- CUDA: FlashAttention-2's varlen kernels (`aten._flash_attention_forward/backward` with cumulative sequence
  lengths), in an autograd.Function; grouped-query attention natively (fewer key/value heads).
- CPU: each sequence through SDPA's math kernel with a causal flag (exact; for tests, and runs that set
  sequence_packing: true on CPU, where `auto` keeps the padded layout).
Called by `backbone.packed_hidden_states`; the workers call `use_packed_attention` once per trained model.
Letters: T packed tokens, Hq query heads, Hkv key/value heads, D head size, N sequences.
"""

import itertools
from typing import Any

import torch
from torch import nn
from torch.nn.attention import SDPBackend, sdpa_kernel
from transformers import AttentionInterface, PreTrainedModel
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

PACKED_ATTENTION = "asyncppo_packed"
"""The implementation's name in transformers' registries (no "flash" in it: transformers treats such names as
FlashAttention packages and changes its masks)."""


class _FlashVarlen(torch.autograd.Function):
    """Causal FlashAttention over packed sequences: q [T, Hq, D], k and v [T, Hkv, D], cu_seq_lens [N + 1]."""

    @staticmethod
    def forward(  # pyright: ignore[reportIncompatibleMethodOverride]
        ctx: Any,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        cu_seq_lens: torch.Tensor,
        max_length: int,
        scale: float,
    ) -> torch.Tensor:
        out, logsumexp, rng_state, unused, _ = torch.ops.aten._flash_attention_forward(
            query, key, value, cu_seq_lens, cu_seq_lens, max_length, max_length, 0.0, True, False, scale=scale
        )
        ctx.save_for_backward(query, key, value, out, logsumexp, cu_seq_lens, rng_state, unused)
        ctx.max_length = max_length
        ctx.scale = scale
        return out

    @staticmethod
    def backward(ctx: Any, grad_out: torch.Tensor) -> tuple[torch.Tensor | None, ...]:  # pyright: ignore[reportIncompatibleMethodOverride]
        query, key, value, out, logsumexp, cu_seq_lens, rng_state, unused = ctx.saved_tensors
        grad_query, grad_key, grad_value = torch.ops.aten._flash_attention_backward(
            grad_out.contiguous(),
            query,
            key,
            value,
            out,
            logsumexp,
            cu_seq_lens,
            cu_seq_lens,
            ctx.max_length,
            ctx.max_length,
            0.0,
            True,
            rng_state,
            unused,
            scale=ctx.scale,
        )
        return grad_query, grad_key, grad_value, None, None, None


def _per_sequence_attention(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, cu_seq_lens: torch.Tensor, scale: float
) -> torch.Tensor:
    """The same attention, one SDPA math-kernel call per sequence ([1, H, L, D] each): exact, for CPU.

    (One call with a [T, T] block-diagonal mask was 4x slower still on the CPU demo's micro-batches: the scores
    of every pair of tokens, not only those within a sequence.)"""
    gqa = query.shape[1] != key.shape[1]
    outputs = []
    with sdpa_kernel([SDPBackend.MATH]):
        for start, end in itertools.pairwise(cu_seq_lens.tolist()):
            q, k, v = (x[start:end].transpose(0, 1).unsqueeze(0) for x in (query, key, value))
            out = nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale, enable_gqa=gqa)
            outputs.append(out.squeeze(0).transpose(0, 1))
    return torch.cat(outputs) if outputs else query.new_zeros(query.shape)


def varlen_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    cu_seq_lens: torch.Tensor,
    max_length: int,
    scale: float,
) -> torch.Tensor:
    """[T, Hq, D]: softmax(q k^T * scale + causal mask within each sequence) v, for packed q [T, Hq, D] and k, v
    [T, Hkv, D] (Hq a multiple of Hkv: grouped-query attention)."""
    if query.shape[1] % key.shape[1]:
        raise ValueError(f"{query.shape[1]} query heads are not a multiple of {key.shape[1]} key/value heads")
    if query.is_cuda:
        return _FlashVarlen.apply(query, key, value, cu_seq_lens, max_length, scale)  # pyright: ignore[reportReturnType]
    return _per_sequence_attention(query, key, value, cu_seq_lens, scale)


def _attention(
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """transformers' attention-function signature: q [1, Hq, T, D], k and v [1, Hkv, T, D] -> [1, T, Hq, D]."""
    cu_seq_lens = kwargs.get("cu_seq_lens_q")
    if cu_seq_lens is None:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout, scaling, **kwargs)  # pyright: ignore[reportReturnType]
    if query.shape[0] != 1 or dropout != 0.0 or not getattr(module, "is_causal", True):
        raise ValueError("packed attention needs one packed row, no attention dropout and a causal decoder")
    scale = scaling if scaling is not None else query.shape[-1] ** -0.5
    q, k, v = (x[0].transpose(0, 1).contiguous() for x in (query, key, value))  # [T, H, D]
    out = varlen_attention(q, k, v, cu_seq_lens, int(kwargs["max_length_q"]), scale)
    return out.unsqueeze(0), None


def use_packed_attention(model: PreTrainedModel) -> None:
    """Switch `model` to the packed-capable implementation (registered with transformers on first use)."""
    AttentionInterface.register(PACKED_ATTENTION, _attention)
    AttentionMaskInterface.register(PACKED_ATTENTION, sdpa_mask)
    model.set_attn_implementation(PACKED_ATTENTION)
