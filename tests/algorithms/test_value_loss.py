"""Clipped MSE value loss: the NeMo-RL cases (basic, clipping, scale, masking, perfect prediction, metric keys,
trailing dim), micro-batch invariance, and explained variance rebuilt from the summed statistics."""

import pytest
import torch

from asyncppo.algorithms.microbatch import loss_normalizers, reduce_microbatch_metrics
from asyncppo.algorithms.value_loss import explained_variance_from_stats, value_loss
from asyncppo.config.losses import ValueLossConfig

pytestmark = pytest.mark.usefixtures("float64")


def with_column0(tokens: torch.Tensor, fill: float = 0.0) -> torch.Tensor:
    """Prepend position 0 (values[0] = V(nothing) = 0), which the loss ignores."""
    return torch.cat([torch.full((tokens.shape[0], 1), fill), tokens], dim=1)


def run(
    settings: ValueLossConfig,
    values: torch.Tensor,
    returns: torch.Tensor,
    old_values: torch.Tensor | None = None,
    mask: torch.Tensor | None = None,
    sample_mask: torch.Tensor | None = None,
    returns_to_abs: torch.Tensor | None = None,
    returns_to_res: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Value loss on token-aligned [B, T] inputs, whole batch as one micro-batch."""
    old_values = values.detach() if old_values is None else old_values
    mask = torch.ones_like(returns) if mask is None else mask
    sample_mask = torch.ones(returns.shape[0]) if sample_mask is None else sample_mask
    token_mask = with_column0(mask)
    return value_loss(
        settings,
        values=with_column0(values),
        old_values=with_column0(old_values),
        returns=with_column0(returns, fill=99.0),
        token_mask=token_mask,
        sample_mask=sample_mask,
        global_valid_tokens=loss_normalizers(token_mask, sample_mask).valid_tokens,
        returns_to_abs=returns_to_abs,
        returns_to_res=returns_to_res,
    )


PLAIN = ValueLossConfig(scale=1.0, cliprange=None)


def test_basic_mse_is_half_mean_squared_error():
    # errors [1, 2] -> 0.5 * (1 + 4) / 2 = 1.25
    loss, metrics = run(PLAIN, torch.tensor([[1.0, 2.0]]), torch.tensor([[2.0, 4.0]]))
    assert loss.item() == pytest.approx(1.25)
    assert metrics["loss"] == pytest.approx(1.25)


def test_clipping_takes_the_larger_error_and_cuts_the_gradient():
    # eps = 0.2, V_old = [1.5, 2], V = [1, 2.5], G = [2, 4]:
    #   token 0: V_c = clamp(1, 1.3, 1.7) = 1.3 -> (1.3 - 2)^2 = 0.49 < (1 - 2)^2 = 1      -> 1    (gradient kept)
    #   token 1: V_c = clamp(2.5, 1.8, 2.2) = 2.2 -> (2.2 - 4)^2 = 3.24 > (2.5 - 4)^2 = 2.25 -> 3.24 (V_c is saturated)
    # clipped loss = 0.5 * (1 + 3.24) / 2 = 1.06 >= unclipped 0.5 * (1 + 2.25) / 2 = 0.8125; vf_clipfrac = 1/2.
    # gradient: token 0: 0.5 * 2 (V - G) / 2 = -0.5; token 1: 0.
    values = torch.tensor([[1.0, 2.5]], requires_grad=True)
    returns, old = torch.tensor([[2.0, 4.0]]), torch.tensor([[1.5, 2.0]])
    clipped, metrics = run(ValueLossConfig(scale=1.0, cliprange=0.2), values, returns, old_values=old)
    unclipped, _ = run(PLAIN, values, returns, old_values=old)
    clipped.backward()
    assert clipped.item() == pytest.approx(1.06)
    assert unclipped.item() == pytest.approx(0.8125)
    assert metrics["vf_clipfrac"] == pytest.approx(0.5)
    assert values.grad is not None
    torch.testing.assert_close(values.grad, torch.tensor([[-0.5, 0.0]]))


def test_clipped_loss_is_never_below_unclipped():
    generator = torch.Generator().manual_seed(3)
    values, returns, old = (torch.randn(4, 6, generator=generator) for _ in range(3))
    clipped, _ = run(ValueLossConfig(scale=1.0, cliprange=0.1), values, returns, old_values=old)
    unclipped, _ = run(PLAIN, values, returns, old_values=old)
    assert clipped.item() > unclipped.item()


def test_double_scale_doubles_the_loss():
    values, returns = torch.tensor([[0.3, -1.0, 2.0]]), torch.tensor([[1.0, 0.0, 1.0]])
    single, _ = run(ValueLossConfig(scale=1.0, cliprange=None), values, returns)
    double, _ = run(ValueLossConfig(scale=2.0, cliprange=None), values, returns)
    assert single.item() > 0
    assert double.item() == pytest.approx(2 * single.item())


def test_masked_tokens_and_masked_samples_do_not_count():
    # Only token (0, 0) is valid: error 1 -> 0.5. The masked token and the whole sample_mask=0 row carry huge errors
    # (and NaN in padding) that must not leak.
    values = torch.tensor([[1.0, 1000.0], [500.0, float("nan")]])
    returns = torch.tensor([[2.0, 0.0], [0.0, 0.0]])
    loss, metrics = run(
        PLAIN, values, returns, mask=torch.tensor([[1.0, 0.0], [1.0, 0.0]]), sample_mask=torch.tensor([1.0, 0.0])
    )
    assert loss.item() == pytest.approx(0.5)
    assert metrics["num_valid_samples"] == 1
    assert (metrics["values_min"], metrics["values_max"]) == (1.0, 1.0)


def test_perfect_prediction_has_zero_loss():
    returns = torch.tensor([[0.2, 0.7, 1.0]])
    loss, _ = run(ValueLossConfig(scale=1.0, cliprange=0.2), returns.clone(), returns)
    assert loss.item() == pytest.approx(0.0, abs=1e-12)


def test_metric_keys_present():
    _, metrics = run(ValueLossConfig(scale=1.0, cliprange=0.2), torch.ones(2, 3), torch.zeros(2, 3))
    expected = {
        "loss",
        "vf_clipfrac",
        "returns_mean",
        "values_mean",
        "returns_sq_mean",
        "values_sq_mean",
        "residual_sq_mean",
        "values_min",
        "values_max",
        "abs_returns_mean",
        "abs_returns_sq_mean",
        "res_returns_mean",
        "res_returns_sq_mean",
        "num_valid_samples",
    }
    assert set(metrics) == expected


def test_trailing_head_dimension_is_squeezed():
    values, returns = torch.tensor([[0.5, 1.5]]), torch.tensor([[1.0, 1.0]])
    token_mask = torch.tensor([[0.0, 1.0, 1.0]])
    kwargs = {
        "returns": with_column0(returns),
        "token_mask": token_mask,
        "sample_mask": torch.ones(1),
        "global_valid_tokens": 2.0,
    }
    flat, _ = value_loss(PLAIN, values=with_column0(values), old_values=with_column0(values), **kwargs)
    head = with_column0(values)[..., None]
    squeezed, _ = value_loss(PLAIN, values=head, old_values=head, **kwargs)
    assert squeezed.shape == ()
    assert squeezed.item() == pytest.approx(flat.item())
    assert flat.item() == pytest.approx(0.5 * (0.25 + 0.25) / 2)


def test_an_all_masked_global_batch_is_an_error_not_a_nan():
    with pytest.raises(ValueError, match="global_valid_tokens"):
        run(PLAIN, torch.ones(1, 2), torch.zeros(1, 2), mask=torch.zeros(1, 2))


def test_settings_reject_non_positive_scale_and_cliprange():
    with pytest.raises(ValueError, match="scale"):
        ValueLossConfig(scale=0.0, cliprange=None)
    with pytest.raises(ValueError, match="cliprange"):
        ValueLossConfig(scale=1.0, cliprange=0.0)


# ---- micro-batch invariance -------------------------------------------------------------------------------------

B, S, F = 5, 8, 3


def _loss_over_splits(settings: ValueLossConfig, splits: list[int]) -> tuple[float, torch.Tensor, dict[str, float]]:
    """Sum of micro-batch losses, accumulated gradient of a tiny right-shifted value head, reduced metrics."""
    torch.manual_seed(0)
    head = torch.nn.Linear(F, 1)
    generator = torch.Generator().manual_seed(2)
    features = torch.randn(B, S, F, generator=generator)
    returns = torch.randn(B, S, generator=generator)
    old_noise = 0.3 * torch.randn(B, S, generator=generator)
    returns_to_abs, returns_to_res = torch.randn(B, generator=generator), torch.randn(B, generator=generator)
    token_mask = torch.zeros(B, S)
    for row, (start, end) in enumerate([(2, 8), (3, 4), (2, 6), (1, 8), (3, 5)]):
        token_mask[row, start:end] = 1.0
    sample_mask = torch.tensor([1.0, 0.0, 0.5, 1.0, 1.0])
    global_valid_tokens = loss_normalizers(token_mask, sample_mask).valid_tokens
    total, metrics, start = 0.0, [], 0
    for size in splits:
        rows = slice(start, start + size)
        start += size
        raw = head(features[rows])  # [b, S, 1]: V(state after token t) ...
        values = torch.cat([torch.zeros_like(raw[:, :1]), raw[:, :-1]], dim=1)  # ... right-shifted, values[0] = 0
        loss, micro_metrics = value_loss(
            settings,
            values=values,
            old_values=values.detach().squeeze(-1) + old_noise[rows],
            returns=returns[rows],
            token_mask=token_mask[rows],
            sample_mask=sample_mask[rows],
            global_valid_tokens=global_valid_tokens,
            returns_to_abs=returns_to_abs[rows],
            returns_to_res=returns_to_res[rows],
        )
        loss.backward()
        total += loss.item()
        metrics.append(micro_metrics)
    gradient = torch.cat([parameter.grad.flatten() for parameter in head.parameters() if parameter.grad is not None])
    return total, gradient, reduce_microbatch_metrics(metrics)


@pytest.mark.parametrize("cliprange", [None, 0.1])
@pytest.mark.parametrize("splits", [[2, 3], [1, 4], [3, 1, 1], [1] * 5], ids=str)
def test_loss_gradient_and_statistics_do_not_depend_on_micro_batch_split(cliprange: float | None, splits: list[int]):
    settings = ValueLossConfig(scale=0.4, cliprange=cliprange)
    whole_loss, whole_gradient, whole_metrics = _loss_over_splits(settings, [B])
    loss, gradient, metrics = _loss_over_splits(settings, splits)
    assert loss == pytest.approx(whole_loss, abs=1e-6)
    torch.testing.assert_close(gradient, whole_gradient, atol=1e-6, rtol=0.0)
    assert metrics.keys() == whole_metrics.keys()
    for key, value in whole_metrics.items():
        assert metrics[key] == pytest.approx(value, abs=1e-6), key
    assert whole_gradient.abs().sum() > 0
    assert explained_variance_from_stats(metrics) == pytest.approx(explained_variance_from_stats(whole_metrics))


# ---- explained variance from the sufficient statistics ----------------------------------------------------------


def _stats(values, returns, returns_to_abs=None, returns_to_res=None) -> dict[str, float]:
    _, metrics = run(PLAIN, values, returns, returns_to_abs=returns_to_abs, returns_to_res=returns_to_res)
    return metrics


def test_dual_ev_without_offsets_is_plain_explained_variance():
    # G = [1, 2, 3, 4], V = [1, 2, 2, 5]: err = [0, 0, 1, -1], Var(err) = 0.5 - 0 = 0.5; Var(G) = 7.5 - 6.25 = 1.25
    # EV = 1 - 0.5 / 1.25 = 0.6 in both spaces.
    ev = explained_variance_from_stats(_stats(torch.tensor([[1.0, 2, 2, 5]]), torch.tensor([[1.0, 2, 3, 4]])))
    assert ev == pytest.approx({"ev_abs": 0.6, "ev_res": 0.6})


def test_each_space_uses_its_own_target_variance():
    # Residual critic: G = residual returns [[.5, .5], [-.5, -.5]], V = [[.25, .5], [-.5, -.25]].
    #   err = [.25, 0, 0, -.25]: mean 0, Var(err) = 0.125 / 4 = 0.03125
    #   res space (offset 0): Var(G) = 0.25                       -> ev_res = 1 - 0.125 = 0.875
    #   abs space (B = [1, 0]): G + B = [[1.5, 1.5], [-.5, -.5]], Var = 1 -> ev_abs = 1 - 0.03125 = 0.96875
    values = torch.tensor([[0.25, 0.5], [-0.5, -0.25]])
    returns = torch.tensor([[0.5, 0.5], [-0.5, -0.5]])
    ev = explained_variance_from_stats(_stats(values, returns, returns_to_abs=torch.tensor([1.0, 0.0])))
    assert ev == pytest.approx({"ev_abs": 0.96875, "ev_res": 0.875})


def test_absolute_arm_ev_res_matches_advantage_variance_ratio():
    # Absolute critic: G = R, V absolute, residual space is R - B (returns_to_res = -B). Then
    # 1 - ev_res = Var(R - V) / Var(R - B).
    #   R = [[1, 1], [0, 0]], V = [[.8, .9], [.1, .3]], B = [.7, .2]
    #   R - V = [.2, .1, -.1, -.3]: mean -0.025, E[x^2] = 0.0375, Var = 0.036875
    #   R - B = [.3, .3, -.2, -.2]: mean 0.05,   E[x^2] = 0.065,  Var = 0.0625  -> 1 - ev_res = 0.59
    #   Var(R) = 0.25 -> ev_abs = 1 - 0.1475 = 0.8525
    values = torch.tensor([[0.8, 0.9], [0.1, 0.3]])
    returns = torch.tensor([[1.0, 1.0], [0.0, 0.0]])
    ev = explained_variance_from_stats(_stats(values, returns, returns_to_res=-torch.tensor([0.7, 0.2])))
    assert 1 - ev["ev_res"] == pytest.approx(0.59)
    assert ev["ev_abs"] == pytest.approx(0.8525)


def test_zero_variance_target_gives_zero_ev_in_both_spaces():
    ev = explained_variance_from_stats(_stats(torch.tensor([[0.1, 0.9]]), torch.tensor([[0.5, 0.5]])))
    assert ev == {"ev_abs": 0.0, "ev_res": 0.0}
