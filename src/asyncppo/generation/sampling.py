"""Next-token sampling from last-position logits, returning each chosen token's logprob.

Called once per decode step by the hf engine (`generation/hf_engine.py`). Pure: settings are per-row tensors so
requests with different SamplingParams share a batch. Letters: N rows, V vocabulary.

The returned logprob is log q(token), where q is the distribution actually sampled from:
    q = softmax(filter(logits / T))    filter = top-k, then top-p on the top-k-renormalised probabilities
With no filter (top_k = 0, top_p = 1) this is bit-for-bit log_softmax(logits.float() / T), which is what the
trainer recomputes (`models.policy.token_logprobs`), so the importance ratio starts at exactly 1 on-policy.
"""

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from asyncppo.generation.protocol import SamplingParams


@dataclass(frozen=True)
class SamplingSettings:
    """Per-row sampling settings as tensors, all [N] on the logits' device."""

    temperature: torch.Tensor
    """float32; the engine sets 1.0 on greedy rows (their logprob is taken at temperature 1)."""
    top_p: torch.Tensor
    """float32 in (0, 1]; 1 disables the filter."""
    top_k: torch.Tensor
    """long >= 0; 0 disables the filter."""
    greedy: torch.Tensor
    """bool; argmax instead of sampling."""

    @classmethod
    def from_params(cls, params: Sequence[SamplingParams], device: torch.device | str) -> "SamplingSettings":
        """Stack one SamplingParams per row."""
        return cls(
            temperature=torch.tensor([1.0 if p.greedy else p.temperature for p in params], device=device),
            top_p=torch.tensor([p.top_p for p in params], dtype=torch.float32, device=device),
            top_k=torch.tensor([p.top_k for p in params], dtype=torch.long, device=device),
            greedy=torch.tensor([p.greedy for p in params], dtype=torch.bool, device=device),
        )

    def select(self, rows: torch.Tensor) -> "SamplingSettings":
        """The settings of the given rows (the engine drops finished rows from its batch)."""
        return SamplingSettings(self.temperature[rows], self.top_p[rows], self.top_k[rows], self.greedy[rows])


def filter_logits(scaled_logits: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """[N, V] fp32 logits with the tokens outside top-k / top-p set to -inf; unfiltered rows are returned as is.

    top-k keeps every token whose logit is >= the k-th largest (ties at the boundary are all kept). top-p then
    keeps the smallest prefix of the top-k tokens, by descending probability, whose renormalised mass reaches
    top_p: a token stays if the mass strictly before it is < top_p, so the most likely token always stays.
    Ties at the top-p boundary are broken by sort order.
    """
    vocab_size = scaled_logits.shape[-1]
    needs_filter = (top_k > 0) | (top_p < 1)
    if not bool(needs_filter.any()):
        return scaled_logits
    rows = needs_filter.nonzero().squeeze(-1)
    sorted_logits, sorted_index = scaled_logits[rows].sort(dim=-1, descending=True)

    k = top_k[rows]
    k = torch.where(k == 0, vocab_size, k.clamp(max=vocab_size))
    kth_largest = sorted_logits.gather(-1, (k - 1).unsqueeze(-1))
    keep = sorted_logits >= kth_largest

    p = top_p[rows].unsqueeze(-1)
    probs = torch.softmax(sorted_logits.masked_fill(~keep, float("-inf")), dim=-1)
    mass_before = probs.cumsum(dim=-1) - probs
    # top_p == 1 must not drop tail tokens whose preceding mass rounds up to 1.0 in fp32.
    keep &= (mass_before < p) | (p >= 1)

    filtered_sorted = sorted_logits.masked_fill(~keep, float("-inf"))
    filtered_rows = torch.full_like(filtered_sorted, float("-inf")).scatter(-1, sorted_index, filtered_sorted)
    filtered = scaled_logits.clone()
    filtered[rows] = filtered_rows
    return filtered


def sample_next_tokens(
    logits: torch.Tensor, settings: SamplingSettings, generator: torch.Generator | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Chosen token ids [N] (long) and their logprobs [N] (fp32) from last-position logits [N, V] of any dtype.

    Sampling rows: token ~ q with q = softmax(filter(logits / T)), drawn with the exponential race
    argmax_v(log q_v - log E_v), E_v ~ Exp(1) i.i.d. (equivalent to the Gumbel-max trick, exact in distribution).
    Greedy rows: token = argmax(logits), logprob = log_softmax(logits)[token] (temperature 1, no filters).
    Noise is drawn for every row, so `generator` advances the same way whichever rows are greedy.
    """
    if logits.dim() != 2:
        raise ValueError(f"logits must be [N, V], got {tuple(logits.shape)}")
    scaled = logits.float() / settings.temperature.unsqueeze(-1)
    filtered = filter_logits(scaled, settings.top_k, settings.top_p)
    filtered = torch.where(settings.greedy.unsqueeze(-1), scaled, filtered)
    logprobs = torch.log_softmax(filtered, dim=-1)

    noise = torch.empty_like(logprobs).exponential_(generator=generator)
    # exponential_ may return exactly 0 in fp32; -log(0) = +inf would turn a -inf logprob into NaN.
    noise.clamp_(min=torch.finfo(noise.dtype).tiny)
    sampled = (logprobs - noise.log()).argmax(dim=-1)
    tokens = torch.where(settings.greedy, scaled.argmax(dim=-1), sampled)
    return tokens, logprobs.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
