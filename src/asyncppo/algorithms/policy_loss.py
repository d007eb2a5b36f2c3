"""Clipped PPO (or CISPO) policy loss with off-policy importance-sampling correction, KL terms and positive NLL.

Called by the policy worker once per micro-batch. Every term is divided by a GLOBAL-batch count
(`microbatch.loss_normalizers`), so summing micro-batch losses and gradients gives the global-batch loss, and
summing the metrics (`microbatch.reduce_microbatch_metrics`) gives global means.

  loss = actor + reference KL + behaviour KL + positive-example NLL

Shapes: B sequences, S token positions; token t's logprob sits at position t, so column 0 of every per-token
tensor is dropped before anything else (S' = S - 1 columns remain). The mismatch metrics are those of
`mismatch.py` (one implementation of each).
"""

import torch

from asyncppo.algorithms.kl import kl_estimate
from asyncppo.algorithms.microbatch import masked_max, masked_min, scalars_to_floats
from asyncppo.algorithms.mismatch import approx_entropy, token_mismatch_stats
from asyncppo.config.losses import PolicyLossConfig


def _aggregate(
    per_token: torch.Tensor,
    token_mask: torch.Tensor,
    sample_mask: torch.Tensor,
    token_level: bool,
    global_valid_tokens: float,
    global_valid_seqs: float,
) -> torch.Tensor:
    """Token level: sum(x m s) / global_valid_tokens.  Sequence level: sum_i s_i mean_t(x_i | m_i) / global_valid_seqs.

    per_token, token_mask: [B, S']; sample_mask: [B]. Invalid positions must already hold finite values.
    """
    if token_level:
        return (per_token * token_mask * sample_mask[:, None]).sum() / global_valid_tokens
    per_sequence = (per_token * token_mask).sum(dim=1) / token_mask.sum(dim=1).clamp(min=1)
    return (per_sequence * sample_mask).sum() / global_valid_seqs


def _sequence_sum(x: torch.Tensor, token_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(sum_t x m, sum_t m) per sequence, [B, 1] each."""
    return (x * token_mask).sum(dim=1, keepdim=True), token_mask.sum(dim=1, keepdim=True)


def importance_weights(
    settings: PolicyLossConfig,
    old_logprobs: torch.Tensor,
    generation_logprobs: torch.Tensor,
    token_mask: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Detached off-policy weights pi_old / pi_gen with truncation, and the per-sequence out-of-bounds flags.

    log w_t = old_t - gen_t per token, or sum_t (old - gen) m_t for every token of a sequence with
    sequence-level ratios; w = exp(log w), NaN/inf -> 0. Truncation with [lo, hi]:
      tis          w <- clamp(w, lo or 0, hi)
      icepop       w <- w 1[lo <= w <= hi]
      seq-mask-tis w <- w 1[lo <= exp(mean_t(old - gen)) <= hi]   (whole sequences; flags returned as [B] bool)
    Inputs [B, S'] (column 0 already dropped); returns ([B, S'], [B] bool or None).
    """
    with torch.no_grad():
        valid = token_mask > 0
        log_ratio = torch.where(valid, old_logprobs - generation_logprobs, 0.0)
        seq_log_ratio, seq_counts = _sequence_sum(log_ratio, token_mask)
        log_weights = seq_log_ratio.expand_as(log_ratio) if settings.sequence_level_importance_ratios else log_ratio
        weights = torch.exp(log_weights)
        weights = torch.where(torch.isfinite(weights), weights, 0.0)
        kind = settings.truncated_importance_sampling_type
        high = settings.truncated_importance_sampling_ratio
        low = settings.truncated_importance_sampling_ratio_min
        out_of_bounds: torch.Tensor | None = None
        if kind == "tis":
            assert high is not None
            weights = weights.clamp(min=low or 0.0, max=high)
        elif kind == "icepop":
            assert high is not None and low is not None
            weights = torch.where((weights >= low) & (weights <= high), weights, 0.0)
        elif kind == "seq-mask-tis":
            assert high is not None and low is not None
            geometric_mean = torch.exp(seq_log_ratio / seq_counts.clamp(min=1)).squeeze(1)
            out_of_bounds = ((geometric_mean < low) | (geometric_mean > high)) & (seq_counts.squeeze(1) > 0)
            weights = torch.where(out_of_bounds[:, None], 0.0, weights)
        return weights, out_of_bounds


def _clipped_actor_terms(
    settings: PolicyLossConfig,
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    token_mask: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-token clipped surrogate L and (ratio, clamped ratio, clipped flag) for metrics; [B, S'] each.

    r = exp(logpi - old) (per token; GSPO: exp(mean_t(logpi - old)) per sequence)
    L = max(-A r, -A clip(r, 1 - ratio_clip_min, 1 + ratio_clip_max)); dual clip where A < 0: L = min(L, -A c).
    disable_ppo_ratio / force_on_policy_ratio: r = exp(logpi - sg(logpi)) (value 1, gradient grad logpi), L = -A r,
    no clipping (REINFORCE; force_on_policy_ratio is meant for one optimizer step per batch, where the PPO ratio
    is exactly 1 anyway). `clipped` marks tokens whose gradient a clip removed.
    use_cispo: L = -sg(clip(r)) A logpi, so dL/dlogpi = -clip(r) A, never zero; `clipped` then marks tokens whose
    weight the clip changed (r outside [1 - ratio_clip_min, 1 + ratio_clip_max]), which still get a gradient.
    """
    valid = token_mask > 0
    log_ratio = torch.where(valid, logprobs - old_logprobs, 0.0)
    if settings.sequence_level_importance_ratios:
        seq_log_ratio, seq_counts = _sequence_sum(log_ratio, token_mask)
        log_ratio = (seq_log_ratio / seq_counts.clamp(min=1)).expand_as(log_ratio)
    ratio = torch.exp(log_ratio)
    clamped = ratio.clamp(1.0 - settings.ratio_clip_min, 1.0 + settings.ratio_clip_max)
    if settings.disable_ppo_ratio or settings.force_on_policy_ratio:
        current = torch.where(valid, logprobs, 0.0)
        surrogate = -advantages * torch.exp(current - current.detach())
        return surrogate, ratio.detach(), clamped.detach(), torch.zeros_like(valid)
    if settings.use_cispo:
        surrogate = -advantages * clamped.detach() * logprobs
        return surrogate, ratio.detach(), clamped.detach(), (clamped != ratio) & valid
    unclipped_loss = -advantages * ratio
    clipped_loss = -advantages * clamped
    surrogate = torch.maximum(unclipped_loss, clipped_loss)
    clipped = clipped_loss > unclipped_loss
    if settings.ratio_clip_c is not None:
        dual_bound = -advantages * settings.ratio_clip_c
        dual_active = (advantages < 0) & (dual_bound < surrogate)
        surrogate = torch.where(dual_active, dual_bound, surrogate)
        clipped = clipped | dual_active
    return surrogate, ratio.detach(), clamped.detach(), clipped


def _reference_kl_per_token(
    settings: PolicyLossConfig,
    logprobs: torch.Tensor,
    reference_logprobs: torch.Tensor,
    generation_logprobs: torch.Tensor | None,
) -> torch.Tensor:
    """rho k(pi_theta, pi_ref) per token ([B, S'] inputs with finite padding), before beta and aggregation.

    k: `reference_policy_kl_type` on log-ratio ref - curr with the kl clamps. rho = exp(curr - gen) (NaN/inf -> 0)
    when generation_logprobs is given (on-policy approximation: the tokens were drawn from pi_gen), else
    exp(curr - sg(curr)), whose value is 1 and whose gradient adds the score-function term k grad(logpi).
    """
    kl = kl_estimate(
        logprobs,
        reference_logprobs,
        settings.reference_policy_kl_type,
        settings.kl_input_clamp_value,
        settings.kl_output_clamp_value,
    )
    if generation_logprobs is None:
        return torch.exp(logprobs - logprobs.detach()) * kl
    weights = torch.exp(logprobs - generation_logprobs)
    return torch.where(torch.isfinite(weights), weights, 0.0) * kl


def _require(tensor: torch.Tensor | None, name: str, reason: str) -> torch.Tensor:
    if tensor is None:
        raise ValueError(f"policy_loss needs {name} when {reason}")
    return tensor


def policy_loss(
    settings: PolicyLossConfig,
    *,
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    generation_logprobs: torch.Tensor | None,
    advantages: torch.Tensor,
    token_mask: torch.Tensor,
    sample_mask: torch.Tensor,
    global_valid_tokens: float,
    global_valid_seqs: float,
    reference_logprobs: torch.Tensor | None = None,
    rewards: torch.Tensor | None = None,
    global_positive_tokens: float | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """PPO policy loss of one micro-batch and its metric contributions.

    logprobs (current policy, with grad), old_logprobs (pre-update, fixed across ppo_epochs), generation_logprobs
    (the generator's, needed by IS correction, on-policy KL approximation, behaviour KL and mismatch metrics),
    advantages, token_mask, reference_logprobs: [B, S]; sample_mask, rewards: [B]. Global counts come from
    `microbatch.loss_normalizers` on the whole global batch. With m = token_mask[:, 1:], s = sample_mask and
    agg() the token- or sequence-level aggregation of `_aggregate`:
      actor        = agg(w L)                                                  (w: `importance_weights`, else 1)
      reference KL = beta agg(rho k(pi_theta, pi_ref)),  rho = exp(curr - gen) with use_on_policy_kl_approximation
                     else exp(curr - sg(curr)) (value 1, carries the score-function gradient)
      behaviour KL = beta_b agg(k(pi_gen, pi_theta))   = KL(pi_gen || pi_theta) on rollout tokens, no IS weight
      NLL          = mu sum(-logpi m s 1[reward > 0]) / global_positive_tokens   (always token level, as VAPO)
    Metrics are sums over this micro-batch divided by the global counts (`_min`/`_max` keys: local extremes);
    mismatch metrics are absent without generation_logprobs, and approx_entropy then samples from pi_old.
    loss = actor_loss + kl_penalty + behaviour_kl + positive_nll_loss holds for the reported terms.
    One function past 60 lines on purpose: it is the one PPO loss, and every term of it reads in one place.
    """
    if not (global_valid_tokens > 0 and global_valid_seqs > 0):
        raise ValueError(
            f"policy_loss: the global batch has no valid token (global_valid_tokens={global_valid_tokens}, "
            f"global_valid_seqs={global_valid_seqs}); every sequence is masked"
        )
    valid = token_mask[:, 1:] > 0

    def tokens(x: torch.Tensor) -> torch.Tensor:
        # Drop column 0; padding may hold anything (NaN, -inf): keep it out of values and gradients.
        return torch.where(valid, x[:, 1:], 0.0)

    curr, old, adv = tokens(logprobs), tokens(old_logprobs), tokens(advantages)
    gen = None if generation_logprobs is None else tokens(generation_logprobs)
    token_mask = token_mask[:, 1:].to(curr.dtype)
    sample_mask = sample_mask.to(curr.dtype)
    mask = token_mask * sample_mask[:, None]

    def aggregate(per_token: torch.Tensor) -> torch.Tensor:
        return _aggregate(
            per_token, token_mask, sample_mask, settings.token_level_loss, global_valid_tokens, global_valid_seqs
        )

    surrogate, ratio, clamped, clipped = _clipped_actor_terms(settings, curr, old, adv, token_mask)
    weights, out_of_bounds = torch.ones_like(ratio), None
    if settings.use_importance_sampling_correction:
        gen_needed = _require(gen, "generation_logprobs", "use_importance_sampling_correction is on")
        weights, out_of_bounds = importance_weights(settings, old, gen_needed, token_mask)
    actor_loss = aggregate(weights * surrogate)

    zero = torch.zeros((), dtype=curr.dtype, device=curr.device)
    reference_kl = behaviour_kl = nll = zero
    if settings.uses_reference_kl:
        reference = tokens(_require(reference_logprobs, "reference_logprobs", "the reference KL is in the loss"))
        sampling = None
        if settings.use_on_policy_kl_approximation:
            sampling = _require(gen, "generation_logprobs", "use_on_policy_kl_approximation is on")
        reference_kl = settings.reference_policy_kl_penalty * aggregate(
            _reference_kl_per_token(settings, curr, reference, sampling)
        )
    if settings.behaviour_kl_penalty > 0:
        gen_needed = _require(gen, "generation_logprobs", "behaviour_kl_penalty > 0")
        kl = kl_estimate(
            gen_needed,
            curr,
            settings.behaviour_kl_type,
            settings.behaviour_kl_input_clamp_value,
            settings.behaviour_kl_output_clamp_value,
        )
        behaviour_kl = settings.behaviour_kl_penalty * aggregate(kl)
    if settings.positive_example_nll_weight > 0:
        positive = _require(rewards, "rewards", "positive_example_nll_weight > 0") > 0
        if global_positive_tokens is None:
            raise ValueError("policy_loss needs global_positive_tokens when positive_example_nll_weight > 0")
        if global_positive_tokens > 0:
            positive_mask = mask * positive.to(curr.dtype)[:, None]
            nll = settings.positive_example_nll_weight * (-curr * positive_mask).sum() / global_positive_tokens

    loss = actor_loss + reference_kl + behaviour_kl + nll
    scalars = {
        "loss": loss.detach(),
        "actor_loss": actor_loss.detach(),
        "kl_penalty": reference_kl.detach(),
        "behaviour_kl": behaviour_kl.detach(),
        "positive_nll_loss": nll.detach(),
        **_diagnostics(ratio, clamped, clipped, weights, mask, global_valid_tokens),
    }
    scalars["approx_entropy"] = approx_entropy(curr, old if gen is None else gen, mask, global_valid_tokens)
    if gen is not None:
        scalars.update(token_mismatch_stats(old, gen, mask, global_valid_tokens, settings.reference_policy_kl_type))
    if out_of_bounds is not None:
        scalars["is_oob_ratio"] = (out_of_bounds.to(curr.dtype) * sample_mask).sum() / global_valid_seqs
    return loss, scalars_to_floats(scalars)


def _diagnostics(
    ratio: torch.Tensor,
    clamped: torch.Tensor,
    clipped: torch.Tensor,
    weights: torch.Tensor,
    mask: torch.Tensor,
    global_valid_tokens: float,
) -> dict[str, torch.Tensor]:
    """Ratio, clipping and IS-weight contributions over the valid tokens of a micro-batch ([B, S'] inputs)."""
    with torch.no_grad():
        sequence_counted = (mask > 0).any(dim=1)

        def mean(x: torch.Tensor) -> torch.Tensor:
            return (x * mask).sum() / global_valid_tokens

        return {
            "probs_ratio": mean(ratio),
            "probs_ratio_clamped": mean(clamped),
            "probs_ratio_min": masked_min(ratio, mask),
            "probs_ratio_max": masked_max(ratio, mask),
            "probs_ratio_clamped_min": masked_min(clamped, mask),
            "probs_ratio_clamped_max": masked_max(clamped, mask),
            "clipfrac": mean(clipped.to(mask.dtype)),
            "sampling_importance_ratio": mean(weights),
            "num_valid_samples": sequence_counted.sum().to(mask.dtype),
        }
