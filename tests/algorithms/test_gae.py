"""Token-level GAE: hand-computed cases, carry-forward masking, decoupled / length-adaptive lambda, KL-in-reward,
and the vectorised recursion against a slow pure-Python reference on random ragged batches."""

import random

import pytest
import torch

from asyncppo.algorithms import gae
from asyncppo.algorithms.gae import (
    gae_recursion,
    kl_reward_penalty,
    length_adaptive_lambda,
    resolve_gae_lambdas,
    token_gae,
    token_rewards,
)


def _row(values: list[float], mask: list[int] | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    v = torch.tensor([values], dtype=torch.float64)
    m = torch.ones_like(v) if mask is None else torch.tensor([mask], dtype=torch.float64)
    return v, m


def test_gamma_one_lambda_zero_gives_one_step_td_errors() -> None:
    # delta_t = r_t + V_{t+1} - V_t with r = [0, 0, 5]: [0 + 2 - 1, 0 + 3 - 2, 5 + 0 - 3] = [1, 1, 2].
    values, mask = _row([1.0, 2.0, 3.0])
    advantages, _ = token_gae(torch.tensor([5.0]), values, mask, gamma=1.0, lambda_value=0.0, lambda_policy=0.0)
    torch.testing.assert_close(advantages, torch.tensor([[1.0, 1.0, 2.0]], dtype=torch.float64))


def test_gamma_and_lambda_zero_give_reward_minus_value() -> None:
    # gamma = 0 drops the bootstrap: A_t = r_t - V_t = [0 - 1, 0 - 2, 5 - 3] = [-1, -2, 2].
    values, mask = _row([1.0, 2.0, 3.0])
    advantages, _ = token_gae(torch.tensor([5.0]), values, mask, gamma=0.0, lambda_value=0.0, lambda_policy=0.0)
    torch.testing.assert_close(advantages, torch.tensor([[-1.0, -2.0, 2.0]], dtype=torch.float64))


def test_gamma_lambda_one_gives_monte_carlo_advantages_and_returns() -> None:
    # gamma = lambda = 1 telescopes: A_t = R - V_t = [3 - 0.5, 3 - 1, 3 - 2]; returns = A + V = R everywhere.
    values, mask = _row([0.5, 1.0, 2.0])
    advantages, returns = token_gae(torch.tensor([3.0]), values, mask, 1.0, 1.0, 1.0)
    torch.testing.assert_close(advantages, torch.tensor([[2.5, 2.0, 1.0]], dtype=torch.float64))
    torch.testing.assert_close(returns, advantages + values)
    torch.testing.assert_close(returns, torch.full((1, 3), 3.0, dtype=torch.float64))


def test_masked_tail_gets_zero_advantage_and_no_bootstrap_from_padding() -> None:
    # Response = positions 0, 1; padding values 7 and 9 must not bootstrap. gamma = 1, lambda = 0:
    # A_1 = R - V_1 = 2 - 0.5 = 1.5 (bootstrap 0 after the last token), A_0 = V_1 - V_0 = 0.5 - 0.25 = 0.25.
    values, mask = _row([0.25, 0.5, 7.0, 9.0], [1, 1, 0, 0])
    advantages, returns = token_gae(torch.tensor([2.0]), values, mask, 1.0, 0.0, 0.0)
    assert advantages[0].tolist() == [0.25, 1.5, 0.0, 0.0]
    assert returns[0, 2:].tolist() == [0.0, 0.0]


def test_interior_masked_gap_is_invisible_to_the_recursion() -> None:
    # A tool-output token with value 999 at position 1 must act as if it were removed: the recursion over
    # [V0, V2, V3] = [1, 2, 3] with gamma = 1, lambda = 0 gives [2 - 1, 3 - 2, 5 - 3] = [1, 1, 2]; gap advantage 0.
    values, mask = _row([1.0, 999.0, 2.0, 3.0], [1, 0, 1, 1])
    advantages, _ = token_gae(torch.tensor([5.0]), values, mask, 1.0, 0.0, 0.0)
    assert advantages[0].tolist() == [1.0, 0.0, 1.0, 2.0]
    # And for a nontrivial gamma, lambda it equals the run with the position removed.
    with_gap, _ = token_gae(torch.tensor([5.0]), values, mask, 0.9, 0.7, 0.7)
    removed, _ = token_gae(torch.tensor([5.0]), *_row([1.0, 2.0, 3.0]), 0.9, 0.7, 0.7)
    torch.testing.assert_close(with_gap[:, [0, 2, 3]], removed)
    assert with_gap[0, 1].item() == 0.0


def test_reward_sits_on_the_last_response_token_and_rows_without_response_get_none() -> None:
    mask = torch.tensor([[0, 1, 1, 0, 0], [0, 0, 0, 0, 0], [1, 0, 1, 0, 1]], dtype=torch.float32)
    r = token_rewards(torch.tensor([2.0, 3.0, 4.0]), mask)
    expected = torch.tensor([[0, 0, 2, 0, 0], [0, 0, 0, 0, 0], [0, 0, 0, 0, 4]], dtype=torch.float32)
    assert torch.equal(r, expected)


def test_kl_penalty_is_subtracted_per_token_and_masked() -> None:
    # k1 with old = 0, ref = [-1, 0, -2, -3]: KL = -(ref - old) = [1, 0, 2, 3]; beta = 0.1 -> p = [.1, 0, .2, .3].
    # Position 3 is padding, so its penalty is masked: r = [-0.1, 0, 5 - 0.2, 0].
    # gamma = lambda = 1, V = 0: A_t = sum_{u >= t} r_u = [4.7, 4.8, 4.8, 0].
    old = torch.zeros(1, 4)
    ref = torch.tensor([[-1.0, 0.0, -2.0, -3.0]])
    penalty = kl_reward_penalty(old, ref, 0.1, "k1", 20.0, 10.0)
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0]])
    advantages, _ = token_gae(torch.tensor([5.0]), torch.zeros(1, 4), mask, 1.0, 1.0, 1.0, penalty)
    torch.testing.assert_close(advantages, torch.tensor([[4.7, 4.8, 4.8, 0.0]]))


def test_zero_kl_penalty_matches_no_penalty() -> None:
    logprobs = torch.randn(2, 5)
    penalty = kl_reward_penalty(logprobs, logprobs.clone(), 0.5, "k3", 20.0, 10.0)
    values, mask = torch.randn(2, 5), torch.ones(2, 5)
    with_kl, _ = token_gae(torch.tensor([1.0, 0.0]), values, mask, 1.0, 0.9, 0.9, penalty)
    without, _ = token_gae(torch.tensor([1.0, 0.0]), values, mask, 1.0, 0.9, 0.9)
    assert torch.equal(with_kl, without)


def test_kl_penalty_applies_the_clamps() -> None:
    # log-ratio -50 is clamped to -20 (input) and k1 = 20 is clamped to 10 (output); beta = 1.
    penalty = kl_reward_penalty(torch.zeros(1, 1), torch.full((1, 1), -50.0), 1.0, "k1", 20.0, 10.0)
    assert penalty.item() == 10.0


def test_per_sample_lambda_equals_separate_scalar_runs() -> None:
    values = torch.tensor([[0.1, 0.4, 0.2, 0.8], [0.3, 0.3, 0.9, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0, 1.0], [1.0, 1.0, 1.0, 0.0]])
    rewards = torch.tensor([1.0, -1.0])
    token_r = token_rewards(rewards, mask)
    both = gae_recursion(token_r, values, mask, 0.95, torch.tensor([0.0, 1.0]))
    row0 = gae_recursion(token_r[:1], values[:1], mask[:1], 0.95, 0.0)
    row1 = gae_recursion(token_r[1:], values[1:], mask[1:], 0.95, 1.0)
    torch.testing.assert_close(both, torch.cat([row0, row1]))


def test_decoupled_lambdas_take_returns_from_lambda_value_and_advantages_from_lambda_policy() -> None:
    # V = [1, 2, 3], R = 5, gamma = 1. lambda_value = 1: A = R - V = [4, 3, 2], returns = 5 everywhere.
    # lambda_policy = 0: A = one-step TD errors [1, 1, 2]; so returns != A_policy + V.
    values, mask = _row([1.0, 2.0, 3.0])
    advantages, returns = token_gae(torch.tensor([5.0]), values, mask, 1.0, lambda_value=1.0, lambda_policy=0.0)
    assert advantages[0].tolist() == [1.0, 1.0, 2.0]
    assert returns[0].tolist() == [5.0, 5.0, 5.0]
    assert not torch.equal(returns, advantages + values)


def test_recursion_runs_once_when_the_lambdas_coincide(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[object] = []
    real = gae.gae_recursion

    def counting(*args: object, **kwargs: object) -> torch.Tensor:
        calls.append(args)
        return real(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(gae, "gae_recursion", counting)
    values, mask = _row([1.0, 2.0, 3.0])
    token_gae(torch.tensor([5.0]), values, mask, 1.0, 0.9, 0.9)
    assert len(calls) == 1
    token_gae(torch.tensor([5.0]), values, mask, 1.0, 0.9, 0.8)
    assert len(calls) == 3


def test_length_adaptive_lambda_is_per_sample_and_clamped() -> None:
    # alpha = 0.5, L = [0, 1, 4, 10]: alpha L = [0, 0.5, 2, 5] -> max(., 1) = [1, 1, 2, 5] -> 1 - 1/. = [0, 0, .5, .8].
    mask = torch.zeros(4, 10)
    for row, length in enumerate([0, 1, 4, 10]):
        mask[row, :length] = 1
    lam = length_adaptive_lambda(mask, 0.5)
    torch.testing.assert_close(lam, torch.tensor([0.0, 0.0, 0.5, 0.8]))
    assert lam.shape == (4,) and bool(((lam >= 0) & (lam <= 1)).all())


def test_lambda_priority_alpha_then_lambda_policy_then_gae_lambda() -> None:
    mask = torch.ones(2, 4)  # L = 4; alpha = 1 -> lambda = 1 - 1/4 = 0.75
    lambda_value, lambda_policy = resolve_gae_lambdas(mask, 0.95, None, 0.5, 1.0)
    assert lambda_value == 0.95
    assert isinstance(lambda_policy, torch.Tensor)
    torch.testing.assert_close(lambda_policy, torch.tensor([0.75, 0.75]))
    assert resolve_gae_lambdas(mask, 0.95, 1.0, 0.5, 0.0) == (1.0, 0.5)
    assert resolve_gae_lambdas(mask, 0.95, None, None, 0.0) == (0.95, 0.95)


@pytest.mark.parametrize(
    ("gae_lambda", "lambda_value", "lambda_policy", "alpha"),
    [(0.9, None, None, -1.0), (1.5, None, None, 0.0), (0.9, -0.1, None, 0.0), (0.9, None, 2.0, 0.0)],
)
def test_invalid_lambda_settings_raise(
    gae_lambda: float, lambda_value: float | None, lambda_policy: float | None, alpha: float
) -> None:
    with pytest.raises(ValueError, match="adv_estimator"):
        resolve_gae_lambdas(torch.ones(1, 2), gae_lambda, lambda_value, lambda_policy, alpha)


def test_gamma_outside_unit_interval_raises() -> None:
    with pytest.raises(ValueError, match="gamma"):
        token_gae(torch.tensor([1.0]), torch.zeros(1, 2), torch.ones(1, 2), 1.5, 0.9, 0.9)


def test_bf16_values_are_recursed_in_fp32() -> None:
    advantages, returns = token_gae(
        torch.tensor([1.0]), torch.zeros(1, 3, dtype=torch.bfloat16), torch.ones(1, 3), 1.0, 1.0, 1.0
    )
    assert advantages.dtype == returns.dtype == torch.float32


def _reference_gae(
    rewards: list[float], values: list[list[float]], mask: list[list[int]], gamma: float, lambdas: list[float]
) -> list[list[float]]:
    """Slow reference: drop the masked positions, run textbook GAE on what is left, put the results back."""
    out: list[list[float]] = []
    for reward, row_values, row_mask, lam in zip(rewards, values, mask, lambdas, strict=True):
        kept = [t for t, m in enumerate(row_mask) if m]
        row_out = [0.0] * len(row_mask)
        running = 0.0
        for i in reversed(range(len(kept))):
            t = kept[i]
            next_value = row_values[kept[i + 1]] if i + 1 < len(kept) else 0.0
            r = reward if i == len(kept) - 1 else 0.0
            running = r + gamma * next_value - row_values[t] + gamma * lam * running
            row_out[t] = running
        out.append(row_out)
    return out


def test_vectorised_gae_matches_a_pure_python_reference_on_random_ragged_batches() -> None:
    torch.manual_seed(0)
    rng = random.Random(0)
    for _ in range(300):
        batch, seq = rng.randint(1, 5), rng.randint(1, 12)
        # Ragged: a prompt prefix, a response with random interior gaps, right padding.
        mask = torch.zeros(batch, seq, dtype=torch.long)
        for row in range(batch):
            start = rng.randint(0, seq)
            end = rng.randint(start, seq)
            mask[row, start:end] = (torch.rand(end - start) < 0.7).long()
        values = torch.randn(batch, seq, dtype=torch.float64)
        rewards = torch.randn(batch, dtype=torch.float64)
        gamma = rng.choice([1.0, 0.99, rng.random()])
        lambdas = [rng.random() for _ in range(batch)]
        per_sample = rng.random() < 0.5
        lam: float | torch.Tensor = torch.tensor(lambdas, dtype=torch.float64) if per_sample else lambdas[0]
        ref_lambdas = lambdas if per_sample else [lambdas[0]] * batch
        got = gae_recursion(token_rewards(rewards, mask, dtype=torch.float64), values, mask, gamma, lam)
        expected = _reference_gae(rewards.tolist(), values.tolist(), mask.tolist(), gamma, ref_lambdas)
        torch.testing.assert_close(got, torch.tensor(expected, dtype=torch.float64), rtol=1e-10, atol=1e-10)
