"""Token-level generalized advantage estimation with carry-forward masking; the one GAE recursion of the package.

Called by `advantages.compute_advantages` (token mode) and by `turns` (the turn MDP runs the same recursion over
turn slots). Shapes: B batch, S sequence positions (or turn slots in turn mode).

Conventions: `values[t] = V(state before token t)` (right-shifted critic, `values[0] = 0`); the mask `m` is 1 on
tokens the policy produced; the terminal reward R sits on the last position with `m = 1`.
"""

import torch

from asyncppo.algorithms.kl import KLType, kl_estimate


def _compute_dtype(values: torch.Tensor) -> torch.dtype:
    # bf16/fp16 critic outputs would lose the small TD increments of long rollouts; recurse in at least fp32.
    return torch.promote_types(values.dtype, torch.float32)


def kl_reward_penalty(
    old_logprobs: torch.Tensor,
    reference_logprobs: torch.Tensor,
    kl_penalty_coef: float,
    kl_type: KLType,
    kl_input_clamp: float | None,
    kl_output_clamp: float | None,
) -> torch.Tensor:
    """Per-token KL-in-reward penalty p_t = beta * KL_t, KL_t = kl_estimate(old_logprobs, reference_logprobs).

    `[B, S]` in, `[B, S]` out; the estimators subtract it from the token rewards (r_t -= p_t) and mask it.
    """
    kl = kl_estimate(old_logprobs, reference_logprobs, kl_type, kl_input_clamp, kl_output_clamp)
    return kl_penalty_coef * kl


def token_rewards(
    rewards: torch.Tensor,
    token_mask: torch.Tensor,
    kl_penalty: torch.Tensor | None = None,
    dtype: torch.dtype = torch.float32,
) -> torch.Tensor:
    """Token rewards `[B, S]`: r_t = R * [t == last_i] - p_t, then r <- r * m.

    last_i = the last position with m = 1; a row with no response token gets no reward. `rewards` is `[B]`,
    `kl_penalty` (optional) `[B, S]`.
    """
    mask = token_mask.to(dtype)
    num_positions = mask.shape[1]
    has_response = mask.sum(dim=1) > 0
    # argmax over the flipped mask finds the first 1 from the right; rows without any 1 are skipped below.
    last = num_positions - 1 - mask.flip(dims=[1]).argmax(dim=1)
    terminal = torch.where(has_response, rewards.to(dtype), torch.zeros_like(rewards, dtype=dtype))
    token_r = torch.zeros_like(mask).scatter(1, last.unsqueeze(1), terminal.unsqueeze(1))
    if kl_penalty is not None:
        token_r = token_r - kl_penalty.to(dtype)
    return token_r * mask


def gae_recursion(
    rewards: torch.Tensor,
    values: torch.Tensor,
    mask: torch.Tensor,
    gamma: float,
    gae_lambda: float | torch.Tensor,
) -> torch.Tensor:
    """Advantages `[B, S]` by the backward GAE recursion with carry-forward masking.

    Start nextV = 0, g = 0 (bootstrap 0 after the last token: truncation is terminal). For t = S-1 .. 0:
        delta_t = r_t + gamma * nextV - V_t
        g'      = delta_t + gamma * lambda * g
        if m_t: nextV <- V_t, g <- g'          (masked positions keep both: no phantom TD errors)
        A_t = g * m_t
    so a masked gap (tool output, padding) is invisible to the recursion and its advantage is 0.
    `gae_lambda` is a scalar or a per-sample `[B]` tensor. The loop runs over time only, vectorised over B.
    """
    dtype = _compute_dtype(values)
    batch_size = values.shape[0]
    valid = mask.bool()
    lam = torch.as_tensor(gae_lambda, dtype=dtype, device=values.device).expand(batch_size)
    discount = gamma * lam
    advantages = torch.zeros(values.shape, dtype=dtype, device=values.device)
    valid_columns = valid.any(dim=0).nonzero()
    if valid_columns.numel() == 0:
        return advantages
    # Columns outside [first, last] are masked in every row: their advantage is 0 and they carry nothing.
    first, last = int(valid_columns[0].item()), int(valid_columns[-1].item())
    r_cols = rewards[:, first : last + 1].to(dtype).unbind(1)
    v_cols = values[:, first : last + 1].to(dtype).unbind(1)
    m_cols = valid[:, first : last + 1].unbind(1)
    next_value = torch.zeros(batch_size, dtype=dtype, device=values.device)
    running = torch.zeros(batch_size, dtype=dtype, device=values.device)
    out: list[torch.Tensor] = []
    for r_t, v_t, m_t in zip(reversed(r_cols), reversed(v_cols), reversed(m_cols), strict=True):
        candidate = r_t + gamma * next_value - v_t + discount * running
        next_value = torch.where(m_t, v_t, next_value)
        running = torch.where(m_t, candidate, running)
        out.append(torch.where(m_t, running, torch.zeros_like(running)))
    advantages[:, first : last + 1] = torch.stack(out[::-1], dim=1)
    return advantages


def length_adaptive_lambda(token_mask: torch.Tensor, length_adaptive_alpha: float) -> torch.Tensor:
    """Per-sample lambda `[B]`: lambda_i = clamp(1 - 1 / max(alpha * L_i, 1), 0, 1), L_i = response tokens of row i."""
    lengths = token_mask.float().sum(dim=1)
    return (1.0 - 1.0 / (length_adaptive_alpha * lengths).clamp(min=1.0)).clamp(0.0, 1.0)


def resolve_gae_lambdas(
    token_mask: torch.Tensor,
    gae_lambda: float,
    gae_lambda_value: float | None,
    gae_lambda_policy: float | None,
    length_adaptive_alpha: float,
) -> tuple[float, float | torch.Tensor]:
    """(lambda_value, lambda_policy) from the decoupled (VAPO) settings.

    lambda_value  = gae_lambda_value if set, else gae_lambda.
    lambda_policy = the length-adaptive `[B]` lambda if alpha > 0, else gae_lambda_policy if set, else gae_lambda.
    """
    if length_adaptive_alpha < 0:
        raise ValueError(f"adv_estimator.length_adaptive_alpha={length_adaptive_alpha} must be >= 0 (0 disables it)")
    for key, lam in (("gae_lambda", gae_lambda), ("gae_lambda_value", gae_lambda_value)):
        if lam is not None and not 0.0 <= lam <= 1.0:
            raise ValueError(f"adv_estimator.{key}={lam} must lie in [0, 1]")
    if gae_lambda_policy is not None and not 0.0 <= gae_lambda_policy <= 1.0:
        raise ValueError(f"adv_estimator.gae_lambda_policy={gae_lambda_policy} must lie in [0, 1]")
    lambda_value = gae_lambda if gae_lambda_value is None else gae_lambda_value
    if length_adaptive_alpha > 0:
        return lambda_value, length_adaptive_lambda(token_mask, length_adaptive_alpha)
    return lambda_value, gae_lambda if gae_lambda_policy is None else gae_lambda_policy


def token_gae(
    rewards: torch.Tensor,
    values: torch.Tensor,
    token_mask: torch.Tensor,
    gamma: float,
    lambda_value: float | torch.Tensor,
    lambda_policy: float | torch.Tensor,
    kl_penalty: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(advantages `[B, S]`, returns `[B, S]`) of token-level GAE with decoupled lambdas.

    returns = (A(lambda_value) + V) * m, 0 off the mask; advantages = A(lambda_policy). The recursion runs
    once when both lambdas are the same float. `rewards` is `[B]`, `values` and `kl_penalty` `[B, S]`.
    """
    if not 0.0 <= gamma <= 1.0:
        raise ValueError(f"gae gamma={gamma} must lie in [0, 1]")
    dtype = _compute_dtype(values)
    token_r = token_rewards(rewards, token_mask, kl_penalty, dtype)
    mask = token_mask.to(dtype)
    value_advantages = gae_recursion(token_r, values, token_mask, gamma, lambda_value)
    returns = (value_advantages + values.to(dtype)) * mask
    both_scalar = not isinstance(lambda_value, torch.Tensor) and not isinstance(lambda_policy, torch.Tensor)
    if both_scalar and lambda_value == lambda_policy:
        return value_advantages, returns
    return gae_recursion(token_r, values, token_mask, gamma, lambda_policy), returns
