"""Attention over packed sequences for Hugging Face decoders: each token attends causally within its own sequence.

`use_packed_attention(model)` registers one attention implementation with transformers and switches the model to
it. A forward that passes `cu_seq_lens_q` (the packed layout of `models/packing.py`) runs varlen attention; any
other forward (padded scoring, generation with a KV cache on the same model) is handed to transformers' own SDPA
implementation with the mask SDPA would get, so nothing else about the model changes.

The packed kernel is chosen explicitly, never by a dispatcher per shape. It is one torch.library custom op,
`asyncppo::varlen_attention_forward` (with `asyncppo::varlen_attention_backward` as its registered backward), so
torch.compile'd decoder layers (`models/compiled_layers.py`) call it as an opaque kernel instead of tracing into
it; each op has a fake kernel giving its output shapes to the compiler. The kernels per device:
- CUDA: FlashAttention-2's varlen kernels (`aten._flash_attention_forward/backward` with cumulative sequence
  lengths); grouped-query attention natively (fewer key/value heads).
- CPU: each sequence's causal attention written out in matrices (scores, log-sum-exp, softmax), with the
  matching hand-written backward; exact, for tests and runs that set sequence_packing: true on CPU (where
  `auto` keeps the padded layout).
Called by `backbone.packed_hidden_states`; the workers call `use_packed_attention` once per trained model.
Letters: T packed tokens, Hq query heads, Hkv key/value heads, G = Hq / Hkv, D head size, N sequences, L the
tokens of one sequence.

With s = q k^T * scale (causal within a sequence), lse = log sum_j exp(s_j), p = exp(s - lse), o = p v:

    dv = p^T do,   dp = do v^T,   ds = p * (dp - rowsum(do * o)),   dq = ds k * scale,   dk = ds^T q * scale

(summed over the G query heads that share a key/value head). Both kernels keep lse [Hq, T] from the forward.
"""

import itertools
from typing import Any

import torch
from torch import nn
from transformers import AttentionInterface, PreTrainedModel
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

PACKED_ATTENTION = "asyncppo_packed"
"""The implementation's name in transformers' registries (no "flash" in it: transformers treats such names as
FlashAttention packages and changes its masks)."""


def _lse_dtype(dtype: torch.dtype) -> torch.dtype:
    """The log-sum-exp's dtype: fp32 as FlashAttention keeps it, fp64 for fp64 inputs (CPU checks in fp64)."""
    return torch.float64 if dtype == torch.float64 else torch.float32


@torch.library.custom_op("asyncppo::varlen_attention_forward", mutates_args=(), device_types="cuda")
def _forward_op(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    cu_seq_lens: torch.Tensor,
    max_length: int,
    scale: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(out [T, Hq, D], lse [Hq, T]) of causal attention within each packed sequence, on CUDA (FlashAttention)."""
    out, lse, _, _, _ = torch.ops.aten._flash_attention_forward(
        query.contiguous(),
        key.contiguous(),
        value.contiguous(),
        cu_seq_lens,
        cu_seq_lens,
        max_length,
        max_length,
        0.0,
        True,
        False,
        scale=scale,
    )
    return out, lse


@torch.library.custom_op("asyncppo::varlen_attention_backward", mutates_args=(), device_types="cuda")
def _backward_op(
    grad_out: torch.Tensor,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    out: torch.Tensor,
    lse: torch.Tensor,
    cu_seq_lens: torch.Tensor,
    max_length: int,
    scale: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(grad query, grad key, grad value) of `_forward_op`, on CUDA (FlashAttention)."""
    # Without dropout the kernel never reads its random-number state: placeholders stand in for the forward's.
    seed_and_offset = torch.zeros(2, dtype=torch.uint64, device=query.device)
    unused = torch.empty(0, device=query.device)
    grad_query, grad_key, grad_value = torch.ops.aten._flash_attention_backward(
        grad_out.contiguous(),
        query.contiguous(),
        key.contiguous(),
        value.contiguous(),
        out,
        lse,
        cu_seq_lens,
        cu_seq_lens,
        max_length,
        max_length,
        0.0,
        True,
        seed_and_offset,
        unused,
        scale=scale,
    )
    return grad_query, grad_key, grad_value


def _sequence_matrices(
    tensors: tuple[torch.Tensor, ...], start: int, end: int, num_query_heads: int, dtype: torch.dtype
) -> list[torch.Tensor]:
    """Each [T, H, D] tensor's rows start..end as [Hq, L, D] in `dtype`; key/value heads repeated G times (query
    head h reads key/value head h // G)."""
    matrices = []
    for tensor in tensors:
        rows = tensor[start:end].to(dtype)
        matrices.append(rows.repeat_interleave(num_query_heads // rows.shape[1], dim=1).transpose(0, 1))
    return matrices


def _causal_scores(query: torch.Tensor, key: torch.Tensor, scale: float) -> torch.Tensor:
    """[Hq, L, L] scores q k^T * scale of one sequence, -inf where a key comes after its query."""
    scores = query @ key.transpose(1, 2) * scale
    length = scores.shape[-1]
    future = torch.ones(length, length, dtype=torch.bool, device=scores.device).triu(1)
    return scores.masked_fill(future, float("-inf"))


@_forward_op.register_kernel("cpu")
def _forward_on_cpu(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    cu_seq_lens: torch.Tensor,
    max_length: int,
    scale: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    # (One call over a [T, T] block-diagonal mask was 4x slower on the CPU demo's micro-batches than one per
    # sequence: it scores every pair of tokens, not only those within a sequence.)
    compute = _lse_dtype(query.dtype)
    out = torch.zeros(query.shape, dtype=query.dtype)
    lse = torch.zeros(query.shape[1], query.shape[0], dtype=compute)
    for start, end in itertools.pairwise(cu_seq_lens.tolist()):
        q, k, v = _sequence_matrices((query, key, value), start, end, query.shape[1], compute)
        scores = _causal_scores(q, k, scale)
        lse[:, start:end] = scores.logsumexp(dim=-1)
        probs = (scores - lse[:, start:end, None]).exp()
        out[start:end] = (probs @ v).transpose(0, 1).to(query.dtype)
    return out, lse


@_backward_op.register_kernel("cpu")
def _backward_on_cpu(
    grad_out: torch.Tensor,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    out: torch.Tensor,
    lse: torch.Tensor,
    cu_seq_lens: torch.Tensor,
    max_length: int,
    scale: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    compute = lse.dtype
    num_heads, num_kv_heads = query.shape[1], key.shape[1]
    grads = [torch.zeros(x.shape, dtype=compute) for x in (query, key, value)]
    for start, end in itertools.pairwise(cu_seq_lens.tolist()):
        q, k, v = _sequence_matrices((query, key, value), start, end, num_heads, compute)
        o, do = _sequence_matrices((out, grad_out), start, end, num_heads, compute)
        probs = (_causal_scores(q, k, scale) - lse[:, start:end, None]).exp()  # 0 where masked
        grad_scores = probs * (do @ v.transpose(1, 2) - (do * o).sum(dim=-1, keepdim=True))
        per_query_head = (grad_scores @ k * scale, grad_scores.transpose(1, 2) @ q * scale, probs.transpose(1, 2) @ do)
        for grad, head_grad, heads in zip(grads, per_query_head, (num_heads, num_kv_heads, num_kv_heads), strict=True):
            # [Hq, L, D] -> [L, heads, D], summing the G query heads that share a key/value head.
            grouped = head_grad.reshape(heads, num_heads // heads, end - start, -1).sum(dim=1)
            grad[start:end] = grouped.transpose(0, 1)
    grad_query, grad_key, grad_value = (grad.to(x.dtype) for grad, x in zip(grads, (query, key, value), strict=True))
    return grad_query, grad_key, grad_value


@_forward_op.register_fake
def _forward_shapes(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    cu_seq_lens: torch.Tensor,
    max_length: int,
    scale: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    return query.new_empty(query.shape), query.new_empty(
        (query.shape[1], query.shape[0]), dtype=_lse_dtype(query.dtype)
    )


@_backward_op.register_fake
def _backward_shapes(
    grad_out: torch.Tensor,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    out: torch.Tensor,
    lse: torch.Tensor,
    cu_seq_lens: torch.Tensor,
    max_length: int,
    scale: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return query.new_empty(query.shape), key.new_empty(key.shape), value.new_empty(value.shape)


def _save_for_backward(ctx: Any, inputs: tuple[Any, ...], output: tuple[torch.Tensor, torch.Tensor]) -> None:
    query, key, value, cu_seq_lens, max_length, scale = inputs
    out, lse = output
    ctx.mark_non_differentiable(lse)
    ctx.save_for_backward(query, key, value, out, lse, cu_seq_lens)
    ctx.max_length = max_length
    ctx.scale = scale


def _backward(ctx: Any, grad_out: torch.Tensor, grad_lse: torch.Tensor | None) -> tuple[torch.Tensor | None, ...]:
    query, key, value, out, lse, cu_seq_lens = ctx.saved_tensors
    grads = _backward_op(grad_out, query, key, value, out, lse, cu_seq_lens, ctx.max_length, ctx.scale)
    return *grads, None, None, None


_forward_op.register_autograd(_backward, setup_context=_save_for_backward)


def varlen_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    cu_seq_lens: torch.Tensor,
    max_length: int,
    scale: float,
) -> torch.Tensor:
    """[T, Hq, D]: softmax(q k^T * scale + causal mask within each sequence) v, for packed q [T, Hq, D] and k, v
    [T, Hkv, D] (Hq a multiple of Hkv: grouped-query attention); cu_seq_lens [N + 1] int32 on q's device,
    max_length the longest sequence (an upper bound also works on CUDA)."""
    if query.shape[1] % key.shape[1]:
        raise ValueError(f"{query.shape[1]} query heads are not a multiple of {key.shape[1]} key/value heads")
    out, _ = _forward_op(query, key, value, cu_seq_lens, max_length, scale)
    return out


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
    # max_length_q goes to the kernel as it came: inside a compiled layer it is a symbolic int, and int() would
    # specialise the graph on it (a recompile for every new longest sequence).
    out = varlen_attention(q, k, v, cu_seq_lens, kwargs["max_length_q"], scale)
    return out.unsqueeze(0), None


def use_packed_attention(model: PreTrainedModel) -> None:
    """Switch `model` to the packed-capable implementation (registered with transformers on first use)."""
    AttentionInterface.register(PACKED_ATTENTION, _attention)
    AttentionMaskInterface.register(PACKED_ATTENTION, sdpa_mask)
    model.set_attn_implementation(PACKED_ATTENTION)
