"""The graph engine's unfiltered sampler on CUDA as one Triton pass over the logits (no [N, V] intermediates).

Same draw as `graph_sampling.sample_tokens` with no top-k / top-p (the CPU path and the reference): for row n

    x_v   = logits[n, v] / T_n                       (fp32, correctly rounded division)
    u_v   = uniforms_from_bits(mix64((key_n + v) * G))   key_n = row_keys(seed_n, position_n)
    token = argmax_v (x_v - log(-log u_v))            (fp64: the exponential race; first index on ties)
    logprob = x_token - logsumexp_v(x_v)              (fp32)

Why a kernel: written as tensor code, the race materialises several fp64 [N, V] buffers (at N = 256 and a
150k vocabulary, 300 MB each) and cost ~1.3 ms a decode step; one pass reads the logits once and keeps the
running best and the running logsumexp in registers. Letters: N rows, V vocabulary, C vocabulary chunks.

    kernel, grid (N, C): chunk c of row n -> best score, its index, max x and sum e^(x - max) over the chunk
    torch, [N, C]:       first best chunk -> token; chunk logsumexps combined -> logprob
"""

import os

import torch

from asyncppo.generation.graph_sampling import row_keys

try:  # Triton ships with CUDA builds of torch; CPU builds sample with `graph_sampling.sample_tokens`.
    import triton
    import triton.language as tl
    from triton.language.extra import libdevice
except ImportError:  # pragma: no cover - exercised on CPU-only installs
    triton = None

RACE_KERNEL_AVAILABLE = triton is not None

# splitmix64 constants as int64 bit patterns (the kernel reinterprets them as uint64).
_GOLDEN_GAMMA = -7046029254386353131
_MIX_MULTIPLIER_1 = -4658895280553007687
_MIX_MULTIPLIER_2 = -7723592293110705685

if RACE_KERNEL_AVAILABLE:

    @triton.jit
    def _race_kernel(
        logits_ptr,
        stride_logits,
        temperature_ptr,
        keys_ptr,
        score_ptr,
        index_ptr,
        max_ptr,
        sum_ptr,
        vocab_size,
        chunk,
        num_chunks,
        gamma,
        multiplier_1,
        multiplier_2,
        BLOCK: tl.constexpr,
        LIBDEVICE_LOG: tl.constexpr,
    ):
        """Chunk `part` of row `row`: the best race score and its first index, and the chunk's max x and sum
        e^(x - max) (module docstring). One body past 60 lines: a Triton kernel is one program whose running best
        and running logsumexp live in registers across the vocabulary loop."""
        row = tl.program_id(0)
        part = tl.program_id(1)
        temperature = tl.load(temperature_ptr + row)
        key = tl.load(keys_ptr + row).to(tl.uint64, bitcast=True)
        gamma_bits = gamma.to(tl.uint64, bitcast=True)
        mix_1 = multiplier_1.to(tl.uint64, bitcast=True)
        mix_2 = multiplier_2.to(tl.uint64, bitcast=True)
        start = part * chunk
        end = tl.minimum(start + chunk, vocab_size)

        best = tl.full([BLOCK], float("-inf"), tl.float64)
        best_index = tl.zeros([BLOCK], tl.int32)
        lane_max = tl.full([BLOCK], float("-inf"), tl.float32)
        lane_sum = tl.zeros([BLOCK], tl.float32)
        for block_start in range(start, end, BLOCK):
            columns = block_start + tl.arange(0, BLOCK)
            valid = columns < end
            x = tl.load(logits_ptr + row * stride_logits + columns, mask=valid, other=float("-inf")).to(tl.float32)
            x = tl.math.div_rn(x, temperature)  # bit-equal to torch's fp32 division
            bits = (key + columns.to(tl.uint64)) * gamma_bits
            bits ^= bits >> 30  # logical shifts: the operand is unsigned
            bits *= mix_1
            bits ^= bits >> 27
            bits *= mix_2
            bits ^= bits >> 31
            uniform = ((bits >> 12).to(tl.float64) + 0.5) * 2.220446049250313e-16  # 2**-52
            if LIBDEVICE_LOG:  # noqa: SIM108 - a statement, so Triton resolves the constexpr branch at compile time
                log_exponential = libdevice.log(-libdevice.log(uniform))
            else:  # Triton's interpreter (CPU tests) has no libdevice
                log_exponential = tl.log(-tl.log(uniform))
            score = tl.where(valid, x.to(tl.float64) - log_exponential, float("-inf"))
            # A lane sees its columns in increasing order, so a strict > keeps the first maximum.
            better = score > best
            best = tl.where(better, score, best)
            best_index = tl.where(better, columns, best_index)
            new_max = tl.maximum(lane_max, x)
            # Lanes that saw only padding so far keep max -inf and sum 0 (no -inf - -inf).
            rescale = tl.where(new_max == float("-inf"), 0.0, tl.exp(lane_max - new_max))
            lane_sum = lane_sum * rescale + tl.where(valid, tl.exp(x - new_max), 0.0)
            lane_max = new_max

        top = tl.max(best, axis=0)
        first = tl.min(tl.where(best == top, best_index, 2147483647), axis=0)
        chunk_max = tl.max(lane_max, axis=0)
        weights = tl.where(lane_max == float("-inf"), 0.0, tl.exp(lane_max - chunk_max))
        out = row * num_chunks + part
        tl.store(score_ptr + out, top)
        tl.store(index_ptr + out, first.to(tl.int64))
        tl.store(max_ptr + out, chunk_max)
        tl.store(sum_ptr + out, tl.sum(lane_sum * weights, axis=0))


def race_chunks(rows: int, vocab_size: int, block: int = 1024) -> int:
    """Vocabulary chunks per row: enough programs to fill the GPU (~8 per SM on 132 SMs), each >= one block."""
    return max(1, min(-(-1056 // rows), -(-vocab_size // block)))


def race_sample_tokens(
    logits: torch.Tensor,
    temperature: torch.Tensor,
    greedy: torch.Tensor,
    seeds: torch.Tensor,
    positions: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Tokens [N] (int64) and logprobs [N] (fp32) of `sample_tokens(..., filtered=False)`, computed in one pass.

    logits [N, V] (any float dtype, unit stride in V); temperature fp32, greedy bool, seeds and positions int64,
    all [N]. Greedy rows take argmax(logits) and their logprob at temperature 1. No host synchronisation.
    """
    assert triton is not None, "race_sample_tokens needs Triton (CUDA builds of torch ship it)"
    rows, vocab_size = logits.shape
    if logits.stride(1) != 1:
        logits = logits.contiguous()
    temperature = torch.where(greedy, 1.0, temperature).float().contiguous()
    keys = row_keys(seeds, positions).contiguous()
    chunks = race_chunks(rows, vocab_size)
    block = 1024
    chunk = -(-vocab_size // chunks)
    chunk = -(-chunk // block) * block
    chunks = -(-vocab_size // chunk)
    scores = torch.empty(rows, chunks, dtype=torch.float64, device=logits.device)
    indices = torch.empty(rows, chunks, dtype=torch.int64, device=logits.device)
    maxima = torch.empty(rows, chunks, dtype=torch.float32, device=logits.device)
    sums = torch.empty_like(maxima)
    _race_kernel[(rows, chunks)](
        logits,
        logits.stride(0),
        temperature,
        keys,
        scores,
        indices,
        maxima,
        sums,
        vocab_size,
        chunk,
        chunks,
        _GOLDEN_GAMMA,
        _MIX_MULTIPLIER_1,
        _MIX_MULTIPLIER_2,
        BLOCK=block,
        LIBDEVICE_LOG=os.environ.get("TRITON_INTERPRET") != "1",
        num_warps=8,
    )
    # torch's argmax returns the first maximum, so the earliest chunk holding the race's best wins ties.
    sampled = indices.gather(-1, scores.argmax(dim=-1, keepdim=True)).squeeze(-1)
    tokens = torch.where(greedy, logits.argmax(dim=-1), sampled)
    overall = maxima.max(dim=-1, keepdim=True).values
    log_normaliser = overall.squeeze(-1) + (sums * (maxima - overall).exp()).sum(dim=-1).log()
    chosen = logits.gather(-1, tokens.unsqueeze(-1)).squeeze(-1).float() / temperature
    return tokens, chosen - log_normaliser
