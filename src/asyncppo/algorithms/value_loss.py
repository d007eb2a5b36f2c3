"""Clipped MSE value loss, with no-grad sufficient statistics from which the trainer rebuilds explained variance.

Called by the value worker once per micro-batch. The loss and every statistic are divided by the GLOBAL count of
valid tokens, so summing micro-batches (`microbatch.reduce_microbatch_metrics`) gives global-batch numbers, and
`explained_variance_from_stats` turns the summed statistics into EV in both spaces (see `critic_metrics`).

Shapes: B sequences, S token positions. Values are right-shifted (values[t] = V(state before token t),
values[0] = 0), so column 0 never holds a prediction and is dropped (S' = S - 1 columns remain), matching
`microbatch.loss_normalizers`.
"""

from collections.abc import Mapping

import torch

from asyncppo.algorithms.critic_metrics import explained_variance
from asyncppo.algorithms.microbatch import masked_max, masked_min, scalars_to_floats
from asyncppo.config.losses import ValueLossConfig


def _squeeze_head(x: torch.Tensor, name: str) -> torch.Tensor:
    """[B, S, 1] (a scalar head's output) -> [B, S]; [B, S] passes through."""
    if x.dim() == 3 and x.shape[-1] == 1:
        return x.squeeze(-1)
    if x.dim() != 2:
        raise ValueError(f"{name} must be [B, S] or [B, S, 1], got shape {tuple(x.shape)}")
    return x


def value_loss(
    settings: ValueLossConfig,
    *,
    values: torch.Tensor,
    old_values: torch.Tensor,
    returns: torch.Tensor,
    token_mask: torch.Tensor,
    sample_mask: torch.Tensor,
    global_valid_tokens: float,
    returns_to_abs: torch.Tensor | None = None,
    returns_to_res: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Value loss of one micro-batch and its metric contributions.

    values (current head output, with grad), old_values (rollout-time), returns: [B, S] or [B, S, 1];
    token_mask [B, S] (the anchor mask in turn mode); sample_mask, returns_to_abs, returns_to_res: [B].
    With m = token_mask x sample_mask and N = global_valid_tokens:
      cliprange eps: V_c = clamp(V, V_old - eps, V_old + eps)
                     loss = 0.5 scale sum(max((V - G)^2, (V_c - G)^2) m) / N
                     vf_clipfrac = sum(1[(V_c - G)^2 > (V - G)^2] m) / N
      otherwise:     loss = 0.5 scale sum((V - G)^2 m) / N
    Statistics (no grad), each sum(. m) / N: returns_mean, values_mean, returns_sq_mean, values_sq_mean,
    residual_sq_mean = E[(G - V)^2], abs_returns_mean/_sq_mean of G + returns_to_abs, res_returns_mean/_sq_mean
    of G + returns_to_res (offsets default to 0); values_min/max (local extremes); num_valid_samples.
    """
    if not global_valid_tokens > 0:
        raise ValueError(f"value_loss: global_valid_tokens={global_valid_tokens}; every token of the batch is masked")
    values = _squeeze_head(values, "values")[:, 1:]
    old_values = _squeeze_head(old_values, "old_values")[:, 1:]
    returns = _squeeze_head(returns, "returns")[:, 1:]
    if not values.shape == old_values.shape == returns.shape == token_mask[:, 1:].shape:
        raise ValueError(
            f"value_loss: values {tuple(values.shape)}, old_values {tuple(old_values.shape)}, returns "
            f"{tuple(returns.shape)} and token_mask {tuple(token_mask[:, 1:].shape)} must agree (column 0 dropped)"
        )
    valid = token_mask[:, 1:] > 0
    mask = token_mask[:, 1:].to(values.dtype) * sample_mask.to(values.dtype)[:, None]
    # Padding may hold anything; keep it out of the loss and its gradient.
    values = torch.where(valid, values, 0.0)
    returns = torch.where(valid, returns, 0.0)
    squared_error = (values - returns).square()
    scalars: dict[str, torch.Tensor] = {}
    if settings.cliprange is not None:
        old_values = torch.where(valid, old_values, 0.0)
        clipped_values = old_values + (values - old_values).clamp(-settings.cliprange, settings.cliprange)
        clipped_error = (clipped_values - returns).square()
        per_token = torch.maximum(squared_error, clipped_error)
        scalars["vf_clipfrac"] = ((clipped_error > squared_error).to(mask.dtype) * mask).sum() / global_valid_tokens
    else:
        per_token = squared_error
    loss = 0.5 * settings.scale * (per_token * mask).sum() / global_valid_tokens
    scalars["loss"] = loss.detach()
    scalars.update(
        _sufficient_statistics(values.detach(), returns, mask, global_valid_tokens, returns_to_abs, returns_to_res)
    )
    return loss, scalars_to_floats(scalars)


def _sufficient_statistics(
    values: torch.Tensor,
    returns: torch.Tensor,
    mask: torch.Tensor,
    global_valid_tokens: float,
    returns_to_abs: torch.Tensor | None,
    returns_to_res: torch.Tensor | None,
) -> dict[str, torch.Tensor]:
    """Moments of one micro-batch ([B, S'] inputs, [B] offsets), float64, each divided by the global count."""
    with torch.no_grad():
        weights = mask.double()
        values64, returns64 = values.double(), returns.double()

        def mean(x: torch.Tensor) -> torch.Tensor:
            return (x * weights).sum() / global_valid_tokens

        def shifted(offset: torch.Tensor | None) -> torch.Tensor:
            return returns64 if offset is None else returns64 + offset.double()[:, None]

        abs_returns, res_returns = shifted(returns_to_abs), shifted(returns_to_res)
        return {
            "returns_mean": mean(returns64),
            "values_mean": mean(values64),
            "returns_sq_mean": mean(returns64.square()),
            "values_sq_mean": mean(values64.square()),
            "residual_sq_mean": mean((returns64 - values64).square()),
            "abs_returns_mean": mean(abs_returns),
            "abs_returns_sq_mean": mean(abs_returns.square()),
            "res_returns_mean": mean(res_returns),
            "res_returns_sq_mean": mean(res_returns.square()),
            "values_min": masked_min(values64, weights),
            "values_max": masked_max(values64, weights),
            "num_valid_samples": (weights > 0).any(dim=1).sum().double(),
        }


def explained_variance_from_stats(stats: Mapping[str, float]) -> dict[str, float]:
    """EV in both spaces from the summed (global) statistics of `value_loss`.

    Var(err) = E[(G - V)^2] - (E[G] - E[V])^2;  Var_space = E[G_space^2] - E[G_space]^2;
    ev_space = 1 - Var(err) / Var_space, 0.0 when Var_space <= 1e-8 (both spaces alike, so this equals
    `critic_metrics.pooled_explained_variance` on the same tokens). Returns {"ev_abs", "ev_res"}.
    """
    error_variance = max(stats["residual_sq_mean"] - (stats["returns_mean"] - stats["values_mean"]) ** 2, 0.0)
    abs_variance = stats["abs_returns_sq_mean"] - stats["abs_returns_mean"] ** 2
    res_variance = stats["res_returns_sq_mean"] - stats["res_returns_mean"] ** 2
    return {
        "ev_abs": explained_variance(error_variance, abs_variance),
        "ev_res": explained_variance(error_variance, res_variance),
    }
