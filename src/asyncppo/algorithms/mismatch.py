"""Train/inference mismatch diagnostics: generation-engine logprobs against the trainer's pre-update logprobs.

Per-token metrics (`token_mismatch_stats`, `approx_entropy`) are the one implementation the policy loss reports;
per-sequence errors drive sequence masking (`mask_sequences_by_logprob_error`, run by the trainer right after the
old logprobs are computed, before the losses) and the mismatch plot (`mismatch_plot_data`).

Shapes: B sequences, S token positions. Logprobs are `[B, S]` with token t's logprob at position t; masks are
1 on the tokens the policy produced. Non-policy positions may hold anything (0, NaN) and never leak into results.
"""

import math
from dataclasses import dataclass

import torch

from asyncppo.algorithms.kl import KLType, kl_estimate
from asyncppo.algorithms.microbatch import scalars_to_floats


def token_mismatch_stats(
    old_logprobs: torch.Tensor,
    generation_logprobs: torch.Tensor,
    mask: torch.Tensor,
    global_valid_tokens: float,
    kl_type: KLType,
) -> dict[str, torch.Tensor]:
    """Per-token mismatch means as 0-dim tensors (no grad), each sum(. * mask) / global_valid_tokens.

    With d = old - gen (trainer minus generator) on valid tokens:
      token_mult_prob_error = mean(exp(|d|))                       (1.0 = engines agree)
      gen_kl_error          = mean(k(log-ratio  d))                  KL(pi_gen || pi_train) on pi_gen samples
      policy_kl_error       = mean(k(log-ratio -d))                  KL(pi_train || pi_gen), as the seed labels it
      js_divergence_error   = mean(0.5 k3(old vs M) + 0.5 k3(gen vs M)),  M = log(0.5 e^old + 0.5 e^gen)
    k is `kl_type` (no clamps). mask: [B, S] (token_mask x sample_mask), old/gen: [B, S].
    """
    with torch.no_grad():
        valid = mask > 0
        old = torch.where(valid, old_logprobs, 0.0)
        gen = torch.where(valid, generation_logprobs, 0.0)
        mixture = torch.logaddexp(old, gen) - math.log(2.0)
        per_token = {
            "token_mult_prob_error": torch.exp((old - gen).abs()),
            "gen_kl_error": kl_estimate(gen, old, kl_type),
            "policy_kl_error": kl_estimate(old, gen, kl_type),
            "js_divergence_error": 0.5 * kl_estimate(old, mixture, "k3") + 0.5 * kl_estimate(gen, mixture, "k3"),
        }
        return {key: (value * mask).sum() / global_valid_tokens for key, value in per_token.items()}


def token_mismatch_metrics(
    old_logprobs: torch.Tensor,
    generation_logprobs: torch.Tensor,
    mask: torch.Tensor,
    global_valid_tokens: float,
    kl_type: KLType,
) -> dict[str, float]:
    """`token_mismatch_stats` as Python floats."""
    return scalars_to_floats(
        token_mismatch_stats(old_logprobs, generation_logprobs, mask, global_valid_tokens, kl_type)
    )


def approx_entropy(
    logprobs: torch.Tensor, sampling_logprobs: torch.Tensor, mask: torch.Tensor, global_valid_tokens: float
) -> torch.Tensor:
    """Entropy of the current policy estimated on tokens drawn from the sampling policy (no grad, 0-dim).

    approx_entropy = -sum(exp(curr - sampling) * curr * mask) / global_valid_tokens, all [B, S].
    """
    with torch.no_grad():
        valid = mask > 0
        curr = torch.where(valid, logprobs, 0.0)
        sampling = torch.where(valid, sampling_logprobs, 0.0)
        return -(torch.exp(curr - sampling) * curr * mask).sum() / global_valid_tokens


def sequence_mult_prob_errors(
    old_logprobs: torch.Tensor, generation_logprobs: torch.Tensor, mask: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-sequence multiplicative probability error and which sequences have a valid token.

    e_i = sum_t exp(|gen - old|) m_t / sum_t m_t over the sequence's valid tokens (m = mask > 0).
    Returns (errors [B], 0.0 where the sequence has no valid token; has_tokens [B] bool).
    """
    with torch.no_grad():
        valid = mask > 0
        per_token = torch.where(valid, torch.exp((generation_logprobs - old_logprobs).abs()), 0.0)
        counts = valid.sum(dim=1)
        errors = per_token.sum(dim=1) / counts.clamp(min=1)
        return errors, counts > 0


def _error_stats(errors: torch.Tensor, suffix: str) -> dict[str, torch.Tensor]:
    return {
        f"max_seq_mult_prob_error{suffix}": errors.max(),
        f"mean_seq_mult_prob_error{suffix}": errors.mean(),
        f"min_seq_mult_prob_error{suffix}": errors.min(),
    }


def mask_sequences_by_logprob_error(
    threshold: float | None,
    *,
    old_logprobs: torch.Tensor,
    generation_logprobs: torch.Tensor,
    token_mask: torch.Tensor,
    sample_mask: torch.Tensor,
    rewards: torch.Tensor,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Drop whole sequences whose multiplicative probability error exceeds `threshold` from the loss.

    A sequence takes part when it has a valid token under token_mask x sample_mask (already-dropped sequences
    neither feed the statistics nor count as masked). With e_i from `sequence_mult_prob_errors`:
      new_sample_mask_i = 1[e_i <= threshold] * sample_mask_i          (a NEW tensor; inputs are untouched)
    Sequences without a valid token keep their sample_mask. threshold None only reports the statistics.

    Metrics (whole batch, not micro-batch contributions): max|mean|min_seq_mult_prob_error over taking-part
    sequences (absent when none); with a threshold also num_masked_seqs_by_logprob_error, masked_correct_pct
    (fraction in [0, 1] of masked sequences with reward == 1; 0.0 when none is masked) and
    max|mean|min_seq_mult_prob_error_after_mask over kept sequences (absent when none is kept).
    Shapes: logprobs, token_mask [B, S]; sample_mask, rewards [B].
    """
    if threshold is not None and not threshold > 0:
        raise ValueError(f"seq_logprob_error_threshold must be None or > 0, got {threshold!r}")
    with torch.no_grad():
        mask = token_mask * sample_mask[:, None]
        errors, taking_part = sequence_mult_prob_errors(old_logprobs, generation_logprobs, mask)
        scalars: dict[str, torch.Tensor] = {}
        if bool(taking_part.any()):
            scalars.update(_error_stats(errors[taking_part], ""))
        if threshold is None:
            return sample_mask.clone(), scalars_to_floats(scalars)
        masked = taking_part & (errors > threshold)
        kept = taking_part & ~masked
        new_sample_mask = torch.where(masked, torch.zeros_like(sample_mask), sample_mask)
        num_masked = masked.sum()
        scalars["num_masked_seqs_by_logprob_error"] = num_masked
        scalars["masked_correct_pct"] = (masked & (rewards == 1)).sum() / num_masked.clamp(min=1)
        if bool(kept.any()):
            scalars.update(_error_stats(errors[kept], "_after_mask"))
        return new_sample_mask, scalars_to_floats(scalars)


@dataclass(frozen=True)
class MismatchPlotData:
    """What the mismatch plot draws for the sequence with the largest multiplicative probability error.

    positions span the sequence's first to last policy token (inclusive); the logprob curves are 0 on the
    non-policy tokens inside that span (tool output between turns), exactly like the generator reports them.
    """

    sample_index: int
    seq_mult_prob_error: float
    positions: list[int]
    generation_logprobs: list[float]
    training_logprobs: list[float]
    abs_diff: list[float]
    max_abs_error_position: int
    max_rel_error_position: int


def mismatch_plot_data(
    old_logprobs: torch.Tensor, generation_logprobs: torch.Tensor, token_mask: torch.Tensor
) -> MismatchPlotData | None:
    """Data of the mismatch plot, or None when no sequence has a policy token (empty generated span).

    Picks argmax_i e_i (token_mask only: a sequence already dropped by sample_mask is still worth seeing).
    abs error = |gen - old|; relative probability error = |p_gen - p_train| / p_gen with p = exp(logprob).
    Shapes: [B, S] each.
    """
    with torch.no_grad():
        errors, has_tokens = sequence_mult_prob_errors(old_logprobs, generation_logprobs, token_mask)
        if not bool(has_tokens.any()):
            return None
        index = int(torch.where(has_tokens, errors, -torch.inf).argmax())
        valid = token_mask[index] > 0
        valid_positions = valid.nonzero().flatten()
        start, end = int(valid_positions[0]), int(valid_positions[-1]) + 1
        gen = torch.where(valid, generation_logprobs[index], 0.0)[start:end].double().cpu()
        train = torch.where(valid, old_logprobs[index], 0.0)[start:end].double().cpu()
        span_valid = valid[start:end].cpu()
        abs_diff = (gen - train).abs()
        p_gen = gen.exp()
        rel_error = (p_gen - train.exp()).abs() / p_gen
        max_abs = int(torch.where(span_valid, abs_diff, -torch.inf).argmax())
        max_rel = int(torch.where(span_valid, rel_error.nan_to_num(nan=-torch.inf), -torch.inf).argmax())
        return MismatchPlotData(
            sample_index=index,
            seq_mult_prob_error=float(errors[index]),
            positions=list(range(start, end)),
            generation_logprobs=[float(v) for v in gen],
            training_logprobs=[float(v) for v in train],
            abs_diff=[float(v) for v in abs_diff],
            max_abs_error_position=start + max_abs,
            max_rel_error_position=start + max_rel,
        )
