"""Packed prefill attention on CUDA as one Triton kernel, so a whole prefill step can be one CUDA graph.

Called by `graph_runner.GraphRunner` inside its captured prefill programs (CUDA only; CPU runs SDPA over a
padded gather in `decoder_forward`). Letters: T packed tokens, Hq / Hk query / KV heads, G = Hq / Hk,
D head dim, L tokens per query block.

    host:   chunks -> query blocks: (first packed token, token count <= L, cache slot) per block
    kernel, grid (blocks, Hk): the L tokens x G query heads of one block over keys 0..p of their slot, where p
            is each token's own position (causal); online softmax with fp32 scores, output [T, Hq * D]

Why a kernel: the SDPA path gathers every row's keys into a padded [N, Hq, K, D] copy, builds a mask, and its
shapes change with every step, so it runs eagerly at ~1 ms of host work per layer (a 256-token prefill cost
~30 ms). This kernel reads the keys in place and takes its layout from device tensors, so the prefill of any
chunk mix of T tokens replays one graph captured for T. The chunk's own K/V are already in the cache (the
projection writes them), so cached prefixes and new tokens are read alike.
"""

import torch

try:  # Triton ships with CUDA builds of torch; CPU builds run the SDPA path instead.
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - exercised on CPU-only installs
    triton = None

PREFILL_KERNEL_AVAILABLE = triton is not None
BLOCK_FIELDS = 3  # per query block: first packed token, token count (0 = unused block), cache slot

if PREFILL_KERNEL_AVAILABLE:

    @triton.jit
    def _prefill_kernel(
        q_ptr,
        k_ptr,
        v_ptr,
        out_ptr,
        positions_ptr,
        blocks_ptr,
        scale,
        stride_q_token,
        stride_q_head,
        stride_k_slot,
        stride_k_head,
        stride_k_pos,
        stride_out_token,
        GROUP: tl.constexpr,
        GROUP_PAD: tl.constexpr,
        HEAD_DIM: tl.constexpr,
        BLOCK_TOKENS: tl.constexpr,
        BLOCK_N: tl.constexpr,
        PRECISION: tl.constexpr,
    ):
        """Query block `block`, KV head `kv_head`: causal attention of the block's tokens x G query heads over their
        slot's keys, online softmax in fp32, written to `out`. One body past 60 lines: a Triton kernel is one
        program whose running max, sum and accumulator live in registers across the key loop."""
        block = tl.program_id(0)
        kv_head = tl.program_id(1)
        first = tl.load(blocks_ptr + block * 3)
        count = tl.load(blocks_ptr + block * 3 + 1)
        if count > 0:
            slot = tl.load(blocks_ptr + block * 3 + 2)
            # Query rows: token-major, G (padded) heads per token.
            rows = tl.arange(0, BLOCK_TOKENS * GROUP_PAD)
            token_offsets = rows // GROUP_PAD
            groups = rows % GROUP_PAD
            live = (token_offsets < count) & (groups < GROUP)
            tokens = first + token_offsets
            heads = kv_head * GROUP + groups
            dims = tl.arange(0, HEAD_DIM)
            # Dead rows see key 0 only (position 0), so their softmax is never empty; they are not stored.
            query_positions = tl.load(positions_ptr + tokens, mask=live, other=0)
            q = tl.load(
                q_ptr + tokens[:, None] * stride_q_token + heads[:, None] * stride_q_head + dims[None, :],
                mask=live[:, None],
                other=0.0,
            )
            # Positions rise along a chunk, so the block's last token sees the most keys.
            last_position = tl.load(positions_ptr + first + count - 1)
            running_max = tl.full([BLOCK_TOKENS * GROUP_PAD], float("-inf"), tl.float32)
            running_sum = tl.zeros([BLOCK_TOKENS * GROUP_PAD], tl.float32)
            acc = tl.zeros([BLOCK_TOKENS * GROUP_PAD, HEAD_DIM], tl.float32)
            base = slot * stride_k_slot + kv_head * stride_k_head
            for block_start in range(0, last_position + 1, BLOCK_N):
                key_positions = block_start + tl.arange(0, BLOCK_N)
                offsets = base + key_positions[:, None] * stride_k_pos + dims[None, :]
                in_range = key_positions[:, None] <= last_position
                keys = tl.load(k_ptr + offsets, mask=in_range, other=0.0)
                scores = tl.dot(q, tl.trans(keys), input_precision=PRECISION) * scale
                scores = tl.where(key_positions[None, :] <= query_positions[:, None], scores, float("-inf"))
                new_max = tl.maximum(running_max, tl.max(scores, axis=1))
                correction = tl.exp(running_max - new_max)
                weights = tl.exp(scores - new_max[:, None])
                running_sum = running_sum * correction + tl.sum(weights, axis=1)
                values = tl.load(v_ptr + offsets, mask=in_range, other=0.0)
                acc = acc * correction[:, None] + tl.dot(weights.to(values.dtype), values, input_precision=PRECISION)
                running_max = new_max
            out = acc / running_sum[:, None]
            tl.store(
                out_ptr + tokens[:, None] * stride_out_token + heads[:, None] * HEAD_DIM + dims[None, :],
                out.to(out_ptr.dtype.element_ty),
                mask=live[:, None],
            )


def group_padding(num_heads: int, num_kv_heads: int) -> int:
    """Query heads per KV head, rounded up to a power of two (the kernel's row groups)."""
    group = num_heads // num_kv_heads
    return 1 << (group - 1).bit_length()


def block_tokens(num_heads: int, num_kv_heads: int) -> int:
    """L: tokens per query block, so that a block holds 128 (token, head) query rows (at least 16)."""
    return max(1, 128 // group_padding(num_heads, num_kv_heads))


def max_query_blocks(num_tokens: int, max_chunks: int, tokens_per_block: int) -> int:
    """Query blocks any prefill of `num_tokens` packed tokens in at most `max_chunks` chunks (+ padding) can need."""
    return num_tokens // tokens_per_block + max_chunks + 1


def query_blocks(
    chunk_lengths: list[int], chunk_slots: list[int], num_tokens: int, pad_slot: int, tokens_per_block: int
) -> list[tuple[int, int, int]]:
    """(first packed token, count, slot) of each query block: the chunks in packing order, then the padding
    tokens up to `num_tokens` (in `pad_slot`, all at position 0)."""
    blocks, offset = [], 0
    for length, slot in [*zip(chunk_lengths, chunk_slots, strict=True), (num_tokens - sum(chunk_lengths), pad_slot)]:
        for start in range(0, length, tokens_per_block):
            blocks.append((offset + start, min(tokens_per_block, length - start), slot))
        offset += length
    return blocks


def triton_prefill_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    positions: torch.Tensor,
    blocks: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    """[T, Hq * D] causal attention of the packed queries q [T, Hq, D] over their slots' cached keys.

    positions [T] int64: each token's position (it attends keys 0..position of its slot); blocks [Q, 3] int64
    from `query_blocks` (rows with count 0 are skipped, so Q may exceed what a step uses: a captured graph
    launches a fixed grid). k_cache, v_cache: one layer's [S + 1, Hk, M, D], contiguous in D.
    """
    assert triton is not None, "triton_prefill_attention needs Triton (CUDA builds of torch ship it)"
    num_tokens, num_heads, head_dim = q.shape
    num_kv_heads = k_cache.shape[1]
    group_pad = group_padding(num_heads, num_kv_heads)
    out = torch.empty(num_tokens, num_heads * head_dim, dtype=q.dtype, device=q.device)
    _prefill_kernel[(blocks.shape[0], num_kv_heads)](
        q,
        k_cache,
        v_cache,
        out,
        positions,
        blocks,
        scale,
        q.stride(0),
        q.stride(1),
        k_cache.stride(0),
        k_cache.stride(1),
        k_cache.stride(2),
        out.stride(0),
        GROUP=num_heads // num_kv_heads,
        GROUP_PAD=group_pad,
        HEAD_DIM=head_dim,
        BLOCK_TOKENS=block_tokens(num_heads, num_kv_heads),
        BLOCK_N=64,
        # fp32 caches (exactness tests) must not round q and k to tf32 inside the tensor-core dot.
        PRECISION="ieee" if q.dtype == torch.float32 else "tf32",
    )
    return out
