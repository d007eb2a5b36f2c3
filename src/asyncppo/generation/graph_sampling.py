"""In-graph next-token sampling for the graph engine's decode step: no host synchronisation, no torch.Generator.

The noise of a row is a pure function of (request seed, position counter, token id), drawn from a counter-based
hash, so a request samples the same tokens whatever rows share its batch, and the noise is the same on CPU and CUDA.
The logprob semantics are those of the hf engine's `sampling.sample_next_tokens`. Letters: N rows, V vocabulary.
"""

import math
from typing import NamedTuple

import torch

# splitmix64 constants, written as the int64 with the same bits (Python ints above 2**63 - 1 do not fit int64).
_GOLDEN_GAMMA = -7046029254386353131  # 0x9E3779B97F4A7C15, odd: x -> x * gamma is a bijection mod 2**64
_MIX_MULTIPLIER_1 = -4658895280553007687  # 0xBF58476D1CE4E5B9
_MIX_MULTIPLIER_2 = -7723592293110705685  # 0x94D049BB133111EB

_UNIFORM_BITS = 52
"""Top bits of a hash kept for a uniform; 52, not 53, so that (bits + 0.5) * 2**-52 is exact in fp64 (see below)."""


def _shift_right_logical(z: torch.Tensor, shift: int) -> torch.Tensor:
    """z >>> shift on int64: torch's >> is arithmetic (copies the sign bit), so the copied bits are masked off."""
    return (z >> shift).bitwise_and_((1 << (64 - shift)) - 1)


def _mix64_(z: torch.Tensor) -> torch.Tensor:
    """mix64 in place: on [N, V], eager code (and a CUDA graph captured from it) then holds z and one shift
    temporary instead of a new buffer per operation; a compiler fuses it all the same."""
    z ^= _shift_right_logical(z, 30)
    z *= _MIX_MULTIPLIER_1
    z ^= _shift_right_logical(z, 27)
    z *= _MIX_MULTIPLIER_2
    z ^= _shift_right_logical(z, 31)
    return z


def mix64(z: torch.Tensor) -> torch.Tensor:
    """The splitmix64 finaliser, elementwise on an int64 tensor: a bijection of the 2**64 bit patterns.

        z = (z ^ (z >>> 30)) * 0xBF58476D1CE4E5B9
        z = (z ^ (z >>> 27)) * 0x94D049BB133111EB
        z =  z ^ (z >>> 31)

    >>> is a logical shift; torch's int64 multiply wraps mod 2**64, as the finaliser needs.
    """
    return _mix64_(z.clone())


def uniforms_from_bits(bits: torch.Tensor) -> torch.Tensor:
    """fp64 uniforms strictly inside (0, 1) from int64 hashes: u = ((bits >>> 12) + 0.5) * 2**-52.

    The top 52 bits b give 2**52 equally likely values, all exact in fp64, from 2**-53 up to 1 - 2**-53. With 53
    bits, (b + 0.5) * 2**-53 would round to exactly 1.0 at b = 2**53 - 1 (fp64 has no room for the half below 1),
    and u = 1 makes the exponential E = -log(u) zero and its log -inf.
    """
    uniforms = _shift_right_logical(bits, 64 - _UNIFORM_BITS).double()
    uniforms += 0.5
    uniforms *= 2.0**-_UNIFORM_BITS
    return uniforms


def row_keys(seeds: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """[N] int64 key of each row: key = mix64(mix64(seed + G) + position * G), G = 0x9E3779B97F4A7C15.

    That is output `position` of a splitmix64 stream seeded by mix64(seed + G): distinct positions of one seed
    never share a key, and distinct seeds start their streams at unrelated points.
    """
    return mix64(mix64(seeds + _GOLDEN_GAMMA) + positions * _GOLDEN_GAMMA)


def counter_uniforms(seeds: torch.Tensor, positions: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """[N, V] fp64 uniforms in (0, 1), u[n, v] a pure function of (seeds[n], positions[n], v).

        u[n, v] = uniforms_from_bits(mix64((key[n] + v) * G)),   key = row_keys(seeds, positions)

    (key + v) * G = key * G + v * G: row n is the splitmix64 stream started at key[n] * G, read at offsets
    0..V-1. One [N] key, then one elementwise expression over [N, V] that a compiler fuses into a single pass.
    seeds and positions are int64 [N].
    """
    if seeds.dtype != torch.int64 or positions.dtype != torch.int64:
        # Narrower integers would overflow at other places than 2**64 and give another (device-dependent) hash.
        raise TypeError(f"seeds and positions must be int64, got {seeds.dtype} and {positions.dtype}")
    token_ids = torch.arange(vocab_size, dtype=torch.int64, device=seeds.device)
    # Not key + v * G: compiled, v * G is the loop index times a constant, whose int64 overflow a C++ compiler
    # may treat as undefined (inductor's CPU code got wrong values). key + v is data, and its product just wraps.
    bits = row_keys(seeds, positions).unsqueeze(-1) + token_ids
    bits *= _GOLDEN_GAMMA
    return uniforms_from_bits(_mix64_(bits))


def filter_all_rows(scaled_logits: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """[N, V] fp32 logits with the tokens outside top-k / top-p set to -inf, computed for every row.

    The rules of `sampling.filter_logits`: top-k keeps every token whose logit is >= the k-th largest (k = 0 means
    k = V); top-p then keeps a token if the top-k-renormalised mass strictly before it (by descending probability)
    is < top_p, and keeps all tokens when top_p >= 1. A row with k = 0 and p = 1 comes back bit-identical. Unlike
    `filter_logits` there is no row selection (no data-dependent shape): every row is sorted.
    """
    vocab_size = scaled_logits.shape[-1]
    sorted_logits, sorted_index = scaled_logits.sort(dim=-1, descending=True)

    k = torch.where(top_k > 0, top_k, vocab_size).clamp(max=vocab_size)
    kth_largest = sorted_logits.gather(-1, (k - 1).unsqueeze(-1))
    keep = sorted_logits >= kth_largest

    p = top_p.unsqueeze(-1)
    probs = torch.softmax(sorted_logits.masked_fill(~keep, float("-inf")), dim=-1)
    mass_before = probs.cumsum(dim=-1) - probs
    # top_p == 1 must not drop tail tokens whose preceding mass rounds up to 1.0 in fp32.
    keep &= (mass_before < p) | (p >= 1)

    keep_by_token = torch.zeros_like(keep).scatter(-1, sorted_index, keep)
    return scaled_logits.masked_fill(~keep_by_token, float("-inf"))


# The filtered log_softmax is an opaque op to torch.compile: inductor (torch 2.11, CUDA) fails to generate code for
# the filter's cumsum of a fused softmax over a full vocabulary. The noise and the argmax around it still fuse.
@torch.library.custom_op("asyncppo::filtered_log_softmax", mutates_args=())
def filtered_log_softmax(
    logits: torch.Tensor, temperature: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor
) -> torch.Tensor:
    """[N, V] fp32 log_softmax(filter_all_rows(logits.float() / T, top_k, top_p)), the log of the sampled q."""
    scaled = logits.float() / temperature.unsqueeze(-1)
    return torch.log_softmax(filter_all_rows(scaled, top_k, top_p), dim=-1)


@filtered_log_softmax.register_fake
def _(logits: torch.Tensor, temperature: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(logits, dtype=torch.float32)


class SamplingRows(NamedTuple):
    """Each row's sampling settings as [N] tensors, in `sample_tokens`' argument order (dtypes: see there).

    The graph runner gathers them from its slot state (decode) or from the prefill chunks, then calls
    `sample_tokens(logits, *rows, filtered=...)` or the race kernel with the fields it reads."""

    temperature: torch.Tensor
    top_p: torch.Tensor
    top_k: torch.Tensor
    greedy: torch.Tensor
    seeds: torch.Tensor
    positions: torch.Tensor


def sample_tokens(
    logits: torch.Tensor,
    temperature: torch.Tensor,
    top_p: torch.Tensor,
    top_k: torch.Tensor,
    greedy: torch.Tensor,
    seeds: torch.Tensor,
    positions: torch.Tensor,
    *,
    filtered: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Chosen token ids [N] (int64) and their logprobs [N] (fp32) from last-position logits [N, V] of any dtype.

    Settings are [N] tensors on the logits' device: temperature fp32, top_p fp32 in (0, 1], top_k int64 >= 0 (0 is
    off), greedy bool; seeds and positions int64 (a request's seed, and a counter that differs at each of its steps).

    Sampling rows: token ~ q = softmax(filter(logits.float() / T)), drawn with the exponential race in fp64
        token = argmax_v(log q_v - log E_v),   E_v = -log u_v,   u = counter_uniforms(seeds, positions, V)
    and logprob = log q(token) in fp32. With no filter (top_k = 0, top_p = 1) that is computed as the trainer does,
    x[token] - logsumexp(x) with x = logits.float() / T (equal to rounding); with filters, as
    log_softmax(filter(x))[token]. Greedy rows: token = argmax(logits), logprob at T = 1 without filters.

    `filtered` is static (chosen on the host from the requests' settings): False skips top-k / top-p entirely (no
    sort), and must only be passed when every row has top_k = 0 and top_p = 1; True filters every row by its own
    k and p. No host synchronisation and no data-dependent shapes, so the call can be captured in a CUDA graph.
    """
    if logits.dim() != 2:
        raise ValueError(f"logits must be [N, V], got {tuple(logits.shape)}")
    # Greedy logprobs are taken at temperature 1 whatever the request's temperature ([N] work, not [N, V]).
    temperature = torch.where(greedy, 1.0, temperature)
    # fp64 noise: fp32 noise is measurably biased in the tail of q, where a token wins only with a very small E.
    # In place, log(-log(u)) = log(E) on the one fp64 buffer (compiled, it all fuses into the argmax below).
    log_exponentials = counter_uniforms(seeds, positions, logits.shape[-1]).log_().neg_().log_()
    greedy_tokens = logits.argmax(dim=-1)  # = argmax(logits.float() / 1), ties included: the cast is exact
    if filtered:
        # Greedy rows keep the whole vocabulary; k = 0 and p = 1 leave their row bit-identical.
        top_k = torch.where(greedy, 0, top_k)
        top_p = torch.where(greedy, 1.0, top_p)
        logprobs = filtered_log_softmax(logits, temperature, top_k, top_p)
        # -inf (filtered) logprobs stay -inf: E is at least ~1e-16, so log(E) is finite.
        tokens = torch.where(greedy, greedy_tokens, _argmax(logprobs.double().sub_(log_exponentials)))
        return tokens, logprobs.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
    # log q(v) = x_v - logsumexp(x), x = logits / T, as the trainer computes it; the race's argmax does not need the
    # normaliser (it shifts a whole row), so no [N, V] logprob tensor is ever written.
    scaled = logits.float() / temperature.unsqueeze(-1)
    tokens = torch.where(greedy, greedy_tokens, _argmax(scaled.double().sub_(log_exponentials)))
    return tokens, scaled.gather(-1, tokens.unsqueeze(-1)).squeeze(-1) - torch.logsumexp(scaled, dim=-1)


def _argmax(values: torch.Tensor) -> torch.Tensor:
    """argmax over the last dim of [N, V] in two stages over C = gcd(V, 64) chunks of the vocabulary.

    Same index as a plain argmax (the first maximum: the first chunk holding it, then its first place there),
    but N x C independent reductions instead of N: with N a few hundred rows and V ~150k, one reduction per row
    would leave most of a GPU idle.
    """
    rows, vocab_size = values.shape
    chunks = math.gcd(vocab_size, 64)
    chunk_max, chunk_index = values.view(rows, chunks, vocab_size // chunks).max(dim=-1)
    best_chunk = chunk_max.argmax(dim=-1, keepdim=True)
    return (best_chunk * (vocab_size // chunks) + chunk_index.gather(-1, best_chunk)).squeeze(-1)
