"""Per-token KL estimators k1 / k2 / k3 between two policies, from log-probabilities of sampled tokens.

Used by the KL-in-reward term of GAE, the reference and behaviour KL terms of the policy loss, and the
mismatch diagnostics. Shapes: `[B, S]` in, `[B, S]` out.
"""

from typing import Literal

import torch

KLType = Literal["k1", "k2", "k3"]


def kl_estimate(
    logprobs: torch.Tensor,
    other_logprobs: torch.Tensor,
    kl_type: KLType,
    input_clamp: float | None = None,
    output_clamp: float | None = None,
) -> torch.Tensor:
    """Estimate KL(pi || other) per token on tokens sampled from pi.

    With log_ratio = other_logprobs - logprobs (clamped to +-input_clamp when given):
      k1 = -log_ratio
      k2 = log_ratio^2 / 2
      k3 = exp(log_ratio) - 1 - log_ratio     (unbiased and non-negative)
    The result is clamped to +-output_clamp when given.
    """
    log_ratio = other_logprobs - logprobs
    if input_clamp is not None:
        log_ratio = log_ratio.clamp(-input_clamp, input_clamp)
    if kl_type == "k1":
        kl = -log_ratio
    elif kl_type == "k2":
        kl = 0.5 * log_ratio.square()
    elif kl_type == "k3":
        kl = torch.expm1(log_ratio) - log_ratio
    else:
        raise ValueError(f"kl_type={kl_type!r} is not one of 'k1', 'k2', 'k3'")
    if output_clamp is not None:
        kl = kl.clamp(-output_clamp, output_clamp)
    return kl
