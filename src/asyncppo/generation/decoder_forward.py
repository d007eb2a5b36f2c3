"""The graph engine's forward passes over a slot-per-sequence KV cache: packed prefill and one decode step.

Called by `generation/graph_runner.py`. Pure functions of tensors (no module state), so the decode layer can
be compiled once and reused for every layer, and the decode step captured in a CUDA graph.
Letters: B decode rows (row b is cache slot b), T packed prefill tokens, N prefill rows, P longest chunk,
W attended key window, S cache slots, M positions per slot, Hq / Hk query / KV heads, D head dim.

Cache layout: one k and one v tensor per layer, [S + 1, Hk, M, D]; slot S is a sink that padded rows write to.
The math follows the HF modules it replaces: RMSNorm in fp32 then cast, rotary with rotate_half, residual
adds in the model dtype, attention scaled by D**-0.5.
"""

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from asyncppo.generation.decoder_weights import DecoderShape, DecoderWeights, LayerWeights


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """weight * (x / sqrt(mean(x^2) + eps)), the mean taken in fp32 over the last dim, cast back before the scale."""
    x32 = x.float()
    normed = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
    return weight * normed.to(x.dtype)


def rotary_tables(
    inverse_frequencies: torch.Tensor, attention_scaling: float, num_positions: int, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin [M, D] for positions 0..M-1: angle = position * inv_freq, duplicated over the two halves."""
    positions = torch.arange(num_positions, dtype=torch.float32, device=inverse_frequencies.device)
    angles = positions[:, None] * inverse_frequencies[None, :]
    angles = torch.cat([angles, angles], dim=-1)
    return (angles.cos() * attention_scaling).to(dtype), (angles.sin() * attention_scaling).to(dtype)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x * cos + rotate_half(x) * sin over heads: x [..., H, D], cos/sin [..., D] (broadcast over H)."""
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos.unsqueeze(-2) + rotated * sin.unsqueeze(-2)


def _mlp(x: torch.Tensor, gate_up: torch.Tensor, down: torch.Tensor) -> torch.Tensor:
    gate, up = F.linear(x, gate_up).chunk(2, dim=-1)
    return F.linear(F.silu(gate) * up, down)


def decode_attention(
    q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, key_mask: torch.Tensor, scale: float
) -> torch.Tensor:
    """[B, Hq * D] attention of one query per row over its cached keys, as explicit matmuls (no SDPA dispatch).

    q [B, Hq, D]; keys, values [B, Hk, W, D] (views of the cache: batch strides collapse, so no copy);
    key_mask [B, W] bool (True = attend). Query heads are grouped per KV head (GQA) by a reshape. Every row
    attends to at least one key, so the softmax never sees an all -inf row.
    """
    rows, num_kv_heads = q.shape[0], keys.shape[1]
    grouped = q.view(rows, num_kv_heads, -1, q.shape[-1])  # [B, Hk, G, D]
    scores = torch.matmul(grouped, keys.transpose(-1, -2)).float() * scale  # [B, Hk, G, W]
    scores = scores.masked_fill(~key_mask[:, None, None, :], float("-inf"))
    probs = torch.softmax(scores, dim=-1).to(values.dtype)
    return torch.matmul(probs, values).reshape(rows, -1)


def layer_qkv(
    hidden: torch.Tensor,
    input_norm: torch.Tensor,
    qkv: torch.Tensor,
    qkv_bias: torch.Tensor | None,
    q_norm: torch.Tensor | None,
    k_norm: torch.Tensor | None,
    cos: torch.Tensor,
    sin: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    write_slots: torch.Tensor,
    write_positions: torch.Tensor,
    shape: DecoderShape,
) -> torch.Tensor:
    """First part of a layer for R token rows (decode: one per sequence; prefill: packed): norm, q/k/v projection,
    Qwen3's per-head q/k norms, rotary. Writes k and v at (write_slots[r], write_positions[r]) of the layer's cache
    [S + 1, Hk, M, D] in place and returns q [R, Hq, D]. Compiled, the write fuses into the projection's epilogue."""
    rows, head_dim = hidden.shape[0], shape.head_dim
    x = rms_norm(hidden, input_norm, shape.rms_norm_eps)
    q, k, v = F.linear(x, qkv, qkv_bias).split([shape.q_size, shape.kv_size, shape.kv_size], dim=-1)
    q = q.view(rows, shape.num_heads, head_dim)
    k = k.view(rows, shape.num_kv_heads, head_dim)
    v = v.view(rows, shape.num_kv_heads, head_dim)
    if q_norm is not None and k_norm is not None:
        q, k = rms_norm(q, q_norm, shape.rms_norm_eps), rms_norm(k, k_norm, shape.rms_norm_eps)
    q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
    k_cache[write_slots, :, write_positions] = k
    v_cache[write_slots, :, write_positions] = v
    return q


def layer_output(
    hidden: torch.Tensor,
    attended: torch.Tensor,
    out: torch.Tensor,
    post_norm: torch.Tensor,
    gate_up: torch.Tensor,
    down: torch.Tensor,
    shape: DecoderShape,
) -> torch.Tensor:
    """Last part of a layer: output projection and residual, then the MLP and residual. [R, hidden] -> [R, hidden]."""
    hidden = hidden + F.linear(attended, out)
    return hidden + _mlp(rms_norm(hidden, post_norm, shape.rms_norm_eps), gate_up, down)


def decode_rest(
    hidden: torch.Tensor,
    q: torch.Tensor,
    keys: torch.Tensor,
    values: torch.Tensor,
    key_mask: torch.Tensor,
    out: torch.Tensor,
    post_norm: torch.Tensor,
    gate_up: torch.Tensor,
    down: torch.Tensor,
    shape: DecoderShape,
) -> torch.Tensor:
    """The decode layer after `layer_qkv`: attention over the cache, then `layer_output`."""
    attended = decode_attention(q, keys, values, key_mask, shape.head_dim**-0.5)
    return layer_output(hidden, attended, out, post_norm, gate_up, down, shape)


def qkv_arguments(layer: LayerWeights) -> tuple[torch.Tensor | None, ...]:
    """The layer's tensors in `layer_qkv`'s argument order (passed one by one so one compiled graph serves all)."""
    return (layer.input_norm, layer.qkv, layer.qkv_bias, layer.q_norm, layer.k_norm)


def rest_arguments(layer: LayerWeights) -> tuple[torch.Tensor, ...]:
    """The layer's tensors in `decode_rest`'s (and `layer_output`'s) argument order."""
    return (layer.out, layer.post_norm, layer.gate_up, layer.down)


def output_logits(hidden: torch.Tensor, weights: DecoderWeights) -> torch.Tensor:
    """[R, V] logits in the model dtype (the sampler casts to fp32) from final-layer hidden states [R, hidden]."""
    return F.linear(rms_norm(hidden, weights.final_norm, weights.shape.rms_norm_eps), weights.lm_head)


@dataclass(frozen=True)
class PrefillBatch:
    """Device tensors of one packed prefill step on the eager path (`prefill_packing.padded_prefill_batch`).

    Row n computes positions starts[n] .. ends[n]-1 of cache slot slots[n]; its tokens are packed contiguously
    in `token_ids`, followed by padding tokens (sink slot, position 0) up to T. `padded_index` [N, P] maps
    (row, offset) to a packed index (0 on padding); `packed_index` [T_real] maps each real packed token to its
    flat (row * P + offset) place; `mask` [N, 1, P, K] is True where a query may attend to a key.
    """

    token_ids: torch.Tensor
    positions: torch.Tensor
    token_slots: torch.Tensor
    slots: torch.Tensor
    padded_index: torch.Tensor
    packed_index: torch.Tensor
    mask: torch.Tensor
    key_length: int
    """Keys attended per row (>= max(ends)), rounded up so the attention kernel's mask is aligned."""


def prefill_mask(starts: torch.Tensor, ends: torch.Tensor, width: int, key_length: int) -> torch.Tensor:
    """[N, 1, P, K] bool: query p of row n (position starts[n] + p) sees key j iff j <= that position and j < ends[n].

    Padded queries (p past the row's chunk) still see key 0, so no softmax row is empty.
    """
    query_positions = starts[:, None] + torch.arange(width, device=starts.device)  # [N, P]
    keys = torch.arange(key_length, device=starts.device)
    return ((keys[None, None, :] <= query_positions[:, :, None]) & (keys[None, None, :] < ends[:, None, None]))[:, None]


def padded_prefill_attention(
    q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, batch: PrefillBatch, shape: DecoderShape
) -> torch.Tensor:
    """[T, Hq * D] causal attention of each packed query over its slot's keys 0..ends[n]-1 (padding rows: 0).

    The eager path (CPU, and CUDA without Triton): SDPA over a padded gather of each row's keys."""
    rows, width = batch.padded_index.shape
    groups = shape.num_heads // shape.num_kv_heads
    queries = q[batch.padded_index].transpose(1, 2)  # [N, Hq, P, D]
    keys = k_cache[batch.slots, :, : batch.key_length].repeat_interleave(groups, dim=1)  # [N, Hq, K, D]
    values = v_cache[batch.slots, :, : batch.key_length].repeat_interleave(groups, dim=1)
    # Pinned, never SDPA's own choice: cuDNN would build a new graph for every new shape, and flash refuses
    # a custom mask. The memory-efficient kernel takes the mask on CUDA; the math kernel is exact on CPU.
    backend = SDPBackend.EFFICIENT_ATTENTION if q.is_cuda else SDPBackend.MATH
    with sdpa_kernel(backend):
        attended = F.scaled_dot_product_attention(
            queries, keys, values, attn_mask=batch.mask, scale=shape.head_dim**-0.5
        )
    flat = attended.transpose(1, 2).reshape(rows * width, -1)
    packed = flat.new_zeros(q.shape[0], flat.shape[1])
    packed[: batch.packed_index.shape[0]] = flat[batch.packed_index]
    return packed


def prefill_forward(
    weights: DecoderWeights,
    k_caches: list[torch.Tensor],
    v_caches: list[torch.Tensor],
    cos_table: torch.Tensor,
    sin_table: torch.Tensor,
    token_ids: torch.Tensor,
    positions: torch.Tensor,
    token_slots: torch.Tensor,
    attend: "Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]",
    qkv_step: "Callable[..., torch.Tensor]" = layer_qkv,
    output_step: "Callable[..., torch.Tensor]" = layer_output,
) -> torch.Tensor:
    """[T, hidden] final-layer hidden states of the packed tokens; writes their K/V into every layer's cache.

    Token t sits at `positions[t]` of cache slot `token_slots[t]`. `attend(q, k_cache, v_cache)` is the
    attention over one layer's cache after the tokens' K/V were written (`padded_prefill_attention` or the
    Triton kernel of `prefill_attention`). `qkv_step` and `output_step` are `layer_qkv` and `layer_output` or
    compiled versions of them (the runner passes the ones its decode step uses).
    """
    shape = weights.shape
    hidden = weights.embed[token_ids]
    cos, sin = cos_table[positions], sin_table[positions]
    for index, layer in enumerate(weights.layers):
        q = qkv_step(
            hidden, *qkv_arguments(layer), cos, sin, k_caches[index], v_caches[index], token_slots, positions, shape
        )
        attended = attend(q, k_caches[index], v_caches[index])
        hidden = output_step(hidden, attended, *rest_arguments(layer), shape)
    return hidden
