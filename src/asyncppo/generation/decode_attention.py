"""Decode attention on CUDA as one Triton split-K kernel pair that reads each row's keys only up to its length.

Called by `graph_runner.GraphRunner` inside the captured decode step (CUDA only; CPU runs the masked matmul in
`decoder_forward.decode_attention`). Letters: B rows (row b reads cache slot b), Hq / Hk query / KV heads,
G = Hq / Hk query heads per KV head, D head dim, M cache positions, C splits of the key range.

    kernel 1, grid (B, Hk, C): the G query heads of one KV head over keys [c * chunk, min((c + 1) * chunk, len)),
              online softmax in fp32: partial max m, sum l and unnormalised output acc [G, D] per split
    kernel 2, grid (B, Hq):    out = sum_c acc_c e^(m_c - m) / sum_c l_c e^(m_c - m),  m = max_c m_c

Why not the masked matmul here: it reads the whole key window of every row and writes fp32 scores, so at
batch 256 it costs ~50 us a layer where the live K and V of that batch take ~10 us to read; and why not SDPA:
flash takes no per-row lengths, the memory-efficient kernel wants KV heads expanded G times, and cuDNN
rebuilds a graph for every new shape. Scores are accumulated in fp32 (q . k never rounds to bf16), as the
trainer's flash attention does.
"""

import torch

try:  # Triton ships with CUDA builds of torch; CPU builds run the masked matmul instead.
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - exercised on CPU-only installs
    triton = None

TRITON_AVAILABLE = triton is not None


if TRITON_AVAILABLE:

    @triton.jit
    def _split_kernel(
        q_ptr,
        k_ptr,
        v_ptr,
        lengths_ptr,
        acc_ptr,
        max_ptr,
        sum_ptr,
        scale,
        chunk,
        stride_q_row,
        stride_q_head,
        stride_k_slot,
        stride_k_head,
        stride_k_pos,
        stride_lengths,
        num_splits,
        GROUP: tl.constexpr,
        GROUP_PAD: tl.constexpr,
        HEAD_DIM: tl.constexpr,
        BLOCK_N: tl.constexpr,
        PRECISION: tl.constexpr,
    ):
        """Split `split` of row `row`, KV head `kv_head`: the online-softmax partials (max, sum, weighted values) of
        its G query heads over keys split * chunk .. min(+chunk, length) - 1. One body past 60 lines: a Triton
        kernel is one program whose running max, sum and accumulator live in registers across the key loop."""
        row = tl.program_id(0)
        kv_head = tl.program_id(1)
        split = tl.program_id(2)
        num_kv_heads = tl.num_programs(1)
        length = tl.load(lengths_ptr + row * stride_lengths)
        start = split * chunk
        end = tl.minimum(start + chunk, length)

        groups = tl.arange(0, GROUP_PAD)
        dims = tl.arange(0, HEAD_DIM)
        heads = kv_head * GROUP + groups
        q = tl.load(
            q_ptr + row * stride_q_row + heads[:, None] * stride_q_head + dims[None, :],
            mask=groups[:, None] < GROUP,
            other=0.0,
        )
        running_max = tl.full([GROUP_PAD], float("-inf"), tl.float32)
        running_sum = tl.zeros([GROUP_PAD], tl.float32)
        acc = tl.zeros([GROUP_PAD, HEAD_DIM], tl.float32)
        base = row * stride_k_slot + kv_head * stride_k_head
        for block_start in range(start, end, BLOCK_N):
            positions = block_start + tl.arange(0, BLOCK_N)
            valid = positions < end
            offsets = base + positions[:, None] * stride_k_pos + dims[None, :]
            keys = tl.load(k_ptr + offsets, mask=valid[:, None], other=0.0)
            scores = tl.dot(q, tl.trans(keys), input_precision=PRECISION) * scale  # [GROUP_PAD, BLOCK_N], fp32 sums
            scores = tl.where(valid[None, :], scores, float("-inf"))
            new_max = tl.maximum(running_max, tl.max(scores, axis=1))
            correction = tl.exp(running_max - new_max)
            weights = tl.exp(scores - new_max[:, None])
            running_sum = running_sum * correction + tl.sum(weights, axis=1)
            values = tl.load(v_ptr + offsets, mask=valid[:, None], other=0.0)
            acc = acc * correction[:, None] + tl.dot(weights.to(values.dtype), values, input_precision=PRECISION)
            running_max = new_max

        partial = ((row * num_kv_heads + kv_head) * GROUP + groups) * num_splits + split  # [B, Hq, C] index
        keep = groups < GROUP
        tl.store(max_ptr + partial, running_max, mask=keep)
        tl.store(sum_ptr + partial, running_sum, mask=keep)
        tl.store(acc_ptr + partial[:, None] * HEAD_DIM + dims[None, :], acc, mask=keep[:, None])

    @triton.jit
    def _combine_kernel(
        acc_ptr, max_ptr, sum_ptr, out_ptr, num_splits, HEAD_DIM: tl.constexpr, SPLITS_PAD: tl.constexpr
    ):
        head_row = tl.program_id(0)  # row * Hq + head
        splits = tl.arange(0, SPLITS_PAD)
        dims = tl.arange(0, HEAD_DIM)
        present = splits < num_splits
        maxima = tl.load(max_ptr + head_row * num_splits + splits, mask=present, other=float("-inf"))
        sums = tl.load(sum_ptr + head_row * num_splits + splits, mask=present, other=0.0)
        overall = tl.max(maxima, axis=0)
        # Splits past a row's length saw no key (max -inf, sum 0): their weight is 0, never NaN.
        weights = tl.where(maxima == float("-inf"), 0.0, tl.exp(maxima - overall))
        accs = tl.load(
            acc_ptr + (head_row * num_splits + splits)[:, None] * HEAD_DIM + dims[None, :],
            mask=present[:, None],
            other=0.0,
        )
        out = tl.sum(accs * weights[:, None], axis=0) / tl.sum(sums * weights, axis=0)
        tl.store(out_ptr + head_row * HEAD_DIM + dims, out.to(out_ptr.dtype.element_ty))


def split_count(rows: int, num_kv_heads: int, max_positions: int, block: int = 64) -> int:
    """Splits of the key range so that rows x Hk x C programs fill the GPU (~4 per SM on 132 SMs), at most 16,
    and no split is shorter than one key block."""
    wanted = -(-528 // (rows * num_kv_heads))
    return max(1, min(16, wanted, max_positions // block))


def triton_decode_attention(
    q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, lengths: torch.Tensor, scale: float, splits: int
) -> torch.Tensor:
    """[B, Hq * D] attention of q [B, Hq, D] (row b) over keys 0..lengths[b]-1 of cache slot b.

    k_cache, v_cache: one layer's [S + 1, Hk, M, D] (contiguous); lengths: [B] int64, every entry >= 1, any
    stride (the runner passes a column of its slot-state matrix).
    """
    assert triton is not None, "triton_decode_attention needs Triton (CUDA builds of torch ship it)"
    rows, num_heads, head_dim = q.shape
    num_kv_heads, max_positions = k_cache.shape[1], k_cache.shape[2]
    group = num_heads // num_kv_heads
    block = 64
    chunk = -(-max_positions // splits)
    chunk = -(-chunk // block) * block
    acc = torch.empty(rows, num_heads, splits, head_dim, dtype=torch.float32, device=q.device)
    maxima = torch.empty(rows, num_heads, splits, dtype=torch.float32, device=q.device)
    sums = torch.empty_like(maxima)
    _split_kernel[(rows, num_kv_heads, splits)](
        q,
        k_cache,
        v_cache,
        lengths,
        acc,
        maxima,
        sums,
        scale,
        chunk,
        q.stride(0),
        q.stride(1),
        k_cache.stride(0),
        k_cache.stride(1),
        k_cache.stride(2),
        lengths.stride(0),
        splits,
        GROUP=group,
        GROUP_PAD=max(16, triton.next_power_of_2(group)),
        HEAD_DIM=head_dim,
        BLOCK_N=block,
        # fp32 caches (exactness tests) must not round q and k to tf32 inside the tensor-core dot.
        PRECISION="ieee" if q.dtype == torch.float32 else "tf32",
    )
    out = torch.empty(rows, num_heads, head_dim, dtype=q.dtype, device=q.device)
    _combine_kernel[(rows * num_heads,)](
        acc, maxima, sums, out, splits, HEAD_DIM=head_dim, SPLITS_PAD=max(2, triton.next_power_of_2(splits))
    )
    return out.view(rows, num_heads * head_dim)
