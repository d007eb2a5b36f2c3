"""compute_advantages: the advantage mask (token x sample), whitening, adv_raw/* and
advantages/* metrics, KL-in-reward wiring, and turn mode through the front door."""

from typing import Any

import pytest
import torch

import ppo_settings
from asyncppo.algorithms.advantages import compute_advantages, raw_advantage_metrics, whiten_advantages
from asyncppo.algorithms.turns import build_turn_spans
from asyncppo.config.losses import PolicyLossConfig
from asyncppo.config.ppo import AdvEstimatorConfig
from ppo_settings import turn_gae


def gae(**overrides: Any) -> AdvEstimatorConfig:
    """A gae section with lambda 0 unless overridden (gamma 1, no residual, no whitening)."""
    return ppo_settings.gae(**({"gae_lambda": 0.0} | overrides))


GAE = gae()
TURN_GAE = turn_gae(normalize_advantages=True, turn_gae_lambda_policy=0.5)


def _one_row() -> dict[str, Any]:
    # Prompt token (value 0, right-shifted), then V = [1, 2, 3] on a 3-token response, R = 5.
    return {
        "rewards": torch.tensor([5.0]),
        "values": torch.tensor([[0.0, 1.0, 2.0, 3.0]]),
        "token_mask": torch.tensor([[0.0, 1.0, 1.0, 1.0]]),
        "sample_mask": torch.ones(1),
        "group_ids": torch.zeros(1, dtype=torch.long),
    }


def _random_batch(batch: int = 6, seq: int = 10, seed: int = 0) -> dict[str, Any]:
    generator = torch.Generator().manual_seed(seed)
    mask = torch.zeros(batch, seq)
    for row in range(batch):
        mask[row, 2 : 4 + row] = 1
    return {
        "rewards": torch.rand(batch, generator=generator),
        "values": torch.rand(batch, seq, generator=generator),
        "token_mask": mask,
        "sample_mask": torch.ones(batch),
        "group_ids": torch.arange(batch) // 2,
    }


def test_front_door_reproduces_the_hand_computed_gae() -> None:
    # gamma = 1, lambda = 0: one-step TD errors [2 - 1, 3 - 2, 5 - 3] = [1, 1, 2]; the prompt position stays 0.
    result = compute_advantages(GAE, **_one_row())
    assert result.advantages.tolist() == [[0.0, 1.0, 1.0, 2.0]]
    assert result.returns is not None and result.returns.tolist() == [[0.0, 2.0, 3.0, 5.0]]
    assert result.critic_mask is not None and result.critic_mask.tolist() == [[0.0, 1.0, 1.0, 1.0]]


def test_raw_advantage_metrics_by_hand() -> None:
    # A = [1, 1, 2]: mean 4/3, biased var ((1/3)^2 * 2 + (2/3)^2) / 3 = 2/9, abs mean 4/3, max |A| 2.
    result = compute_advantages(gae(normalize_advantages=True), **_one_row())
    std = (2 / 9) ** 0.5
    assert result.metrics["adv_raw/mean"] == pytest.approx(4 / 3)
    assert result.metrics["adv_raw/std"] == pytest.approx(std)
    assert result.metrics["adv_raw/abs_mean"] == pytest.approx(4 / 3)
    assert result.metrics["adv_raw/max_abs"] == pytest.approx(2.0)
    assert result.metrics["adv_raw/whiten_gain"] == pytest.approx(1 / (std + 1e-8))
    # Post-whitening, unbiased var 1/3: [1, 1, 2] -> (A - 4/3) / sqrt(1/3 + 1e-8) = [-1/sqrt3, -1/sqrt3, 2/sqrt3].
    assert result.metrics["advantages/max"] == pytest.approx(2 / 3**0.5, rel=1e-6)
    assert result.metrics["advantages/min"] == pytest.approx(-1 / 3**0.5, rel=1e-6)
    assert result.metrics["advantages/mean"] == pytest.approx(0.0, abs=1e-6)
    assert "adv_raw/whiten_gain" not in compute_advantages(GAE, **_one_row()).metrics


def test_raw_advantage_metrics_are_empty_below_two_valid_tokens() -> None:
    assert raw_advantage_metrics(torch.tensor([[3.0, 4.0]]), torch.tensor([[0.0, 1.0]]), True) == {}


def test_normalized_advantages_have_zero_mean_and_unit_std_over_the_mask() -> None:
    batch = _random_batch()
    result = compute_advantages(gae(normalize_advantages=True, gae_lambda=0.95), **batch)
    valid = result.advantages[batch["token_mask"].bool()]
    assert abs(valid.mean().item()) < 1e-5
    assert valid.std().item() == pytest.approx(1.0, abs=1e-5)
    assert bool((result.advantages[~batch["token_mask"].bool()] == 0).all())


def test_masked_sequences_do_not_change_whitening_statistics() -> None:
    batch = _random_batch()
    settings = gae(normalize_advantages=True, gae_lambda=0.95)
    kept = [0, 1, 2, 3, 4]
    reference = compute_advantages(settings, **{key: value[kept] for key, value in batch.items()})
    batch["sample_mask"][5] = 0.0
    batch["rewards"][5] = 1e4  # an outlier that would dominate the statistics if it leaked
    result = compute_advantages(settings, **batch)
    torch.testing.assert_close(result.advantages[:5], reference.advantages)
    assert bool((result.advantages[5] == 0).all())
    assert result.metrics["adv_raw/std"] == pytest.approx(reference.metrics["adv_raw/std"])
    # The masked sample still gets real critic targets (its returns are those of an unmasked run).
    unmasked = compute_advantages(settings, **{**batch, "sample_mask": torch.ones(6)})
    assert result.returns is not None and unmasked.returns is not None
    assert torch.equal(result.returns[5], unmasked.returns[5])


@pytest.mark.parametrize("which", ["token_mask", "sample_mask"])
def test_all_masked_batch_raises(which: str) -> None:
    batch = _random_batch()
    batch[which] = torch.zeros_like(batch[which])
    with pytest.raises(ValueError, match="every token is masked"):
        compute_advantages(gae(normalize_advantages=True), **batch)


def test_single_valid_token_whitens_to_zero_not_nan() -> None:
    advantages = whiten_advantages(torch.tensor([[5.0, 3.0]]), torch.tensor([[0.0, 1.0]]), True)
    assert advantages.tolist() == [[0.0, 0.0]]


def test_kl_in_reward_is_wired_from_the_settings() -> None:
    # k1 with old = 0, ref = -1 on every token: KL = 1, beta = 0.5 -> r = [-0.5, -0.5, 5 - 0.5] on the response.
    # gamma = 1, lambda = 0: A = [-0.5 + 2 - 1, -0.5 + 3 - 2, 4.5 - 3] = [0.5, 0.5, 1.5].
    row = _one_row()
    logprobs: dict[str, Any] = {"old_logprobs": torch.zeros(1, 4), "reference_logprobs": torch.full((1, 4), -1.0)}
    kl = {"reference_policy_kl_penalty": 0.5, "reference_policy_kl_type": "k1"}
    loss = PolicyLossConfig(use_kl_in_reward=True, **kl)
    result = compute_advantages(GAE, loss, **row, **logprobs)
    torch.testing.assert_close(result.advantages, torch.tensor([[0.0, 0.5, 0.5, 1.5]]))
    # use_kl_in_reward = false ignores the logprobs; identical logprobs (KL = 0) change nothing.
    ignored = compute_advantages(GAE, PolicyLossConfig(use_kl_in_reward=False, **kl), **row, **logprobs)
    assert torch.equal(ignored.advantages, compute_advantages(GAE, **row).advantages)
    same: dict[str, Any] = {"old_logprobs": torch.zeros(1, 4), "reference_logprobs": torch.zeros(1, 4)}
    assert torch.equal(compute_advantages(GAE, loss, **row, **same).advantages, ignored.advantages)
    with pytest.raises(ValueError, match="needs old and reference logprobs"):
        compute_advantages(GAE, loss, **row)


def test_length_adaptive_lambda_through_the_front_door() -> None:
    # L = 3, alpha = 0.5: lambda = 1 - 1 / 1.5 = 1/3; lambda_value = 1 gives returns R = 5.
    settings = gae(gae_lambda_value=1.0, gae_lambda_policy=0.9, length_adaptive_alpha=0.5)
    result = compute_advantages(settings, **_one_row())
    assert result.metrics["advantages/lambda_policy_mean"] == pytest.approx(1 / 3)
    assert result.returns is not None
    torch.testing.assert_close(result.returns, torch.tensor([[0.0, 5.0, 5.0, 5.0]]))
    # lambda = 1/3, gamma = 1: A3 = 2, A2 = 1 + 2/3 = 5/3, A1 = 1 + 5/9 = 14/9.
    torch.testing.assert_close(result.advantages, torch.tensor([[0.0, 14 / 9, 5 / 3, 2.0]]))


def test_missing_values_or_spans_fail_loud() -> None:
    row = _one_row()
    with pytest.raises(ValueError, match="needs critic values"):
        compute_advantages(GAE, **{**row, "values": None})
    with pytest.raises(ValueError, match="needs turn_spans"):
        compute_advantages(TURN_GAE, **row)


def test_shape_mismatches_raise() -> None:
    row = _one_row()
    with pytest.raises(ValueError, match="values must be"):
        compute_advantages(GAE, **{**row, "values": torch.zeros(1, 3)})
    with pytest.raises(ValueError, match="rewards must be"):
        compute_advantages(GAE, **{**row, "rewards": torch.zeros(2)})


def _turn_batch() -> dict[str, Any]:
    logs = [
        [("user", 2), ("assistant", 2), ("tool", 1), ("assistant", 2)],
        [("user", 3), ("assistant", 3)],
        [("user", 1), ("assistant", 1), ("user", 1), ("assistant", 2)],
    ]
    spans = build_turn_spans(logs, seq_len=8)
    values = torch.zeros(3, 8)
    values[0, [2, 5]] = torch.tensor([0.2, 0.6])
    values[1, 3] = 0.5
    values[2, [1, 3]] = torch.tensor([0.1, 0.3])
    return {
        "rewards": torch.tensor([1.0, 0.0, 1.0]),
        "values": values,
        "token_mask": (spans.turn_index >= 0).float(),
        "sample_mask": torch.ones(3),
        "group_ids": torch.tensor([0, 0, 0]),
        "turn_spans": spans,
    }


def test_turn_mode_advantages_constant_in_turns_returns_at_anchors_and_raw_metrics_reported() -> None:
    batch = _turn_batch()
    result = compute_advantages(TURN_GAE, **batch)
    spans = build_turn_spans(
        [
            [("user", 2), ("assistant", 2), ("tool", 1), ("assistant", 2)],
            [("user", 3), ("assistant", 3)],
            [("user", 1), ("assistant", 1), ("user", 1), ("assistant", 2)],
        ],
        seq_len=8,
    )
    # Constant within a turn.
    for row in range(3):
        for k in range(int(spans.num_turns[row])):
            assert result.advantages[row][spans.turn_index[row] == k].unique().numel() == 1
    # gamma = lambda_value = 1: G_k = R at every anchor, 0 elsewhere; the critic mask is the anchor mask.
    expected_returns = torch.zeros(3, 8)
    expected_returns[0, [2, 5]] = 1.0
    expected_returns[2, [1, 3]] = 1.0
    assert result.returns is not None and torch.equal(result.returns, expected_returns)
    assert result.critic_mask is not None and torch.equal(result.critic_mask.bool(), spans.anchor_mask)
    # Pre-whitening token metrics sit next to the turn metrics. lambda_policy = 0.5, gamma = 1:
    # sample 0: A2 = 1 - 0.6 = 0.4, A1 = 0.6 - 0.2 + 0.5 * 0.4 = 0.6; sample 1: A1 = 0 - 0.5 = -0.5;
    # sample 2: A2 = 1 - 0.3 = 0.7, A1 = 0.3 - 0.1 + 0.35 = 0.55. Tokens: 2x0.6, 2x0.4, 3x-0.5, 1x0.55, 2x0.7.
    tokens = torch.tensor([0.6, 0.6, 0.4, 0.4, -0.5, -0.5, -0.5, 0.55, 0.7, 0.7], dtype=torch.float64)
    assert result.metrics["adv_raw/mean"] == pytest.approx(tokens.mean().item())
    assert result.metrics["adv_raw/std"] == pytest.approx(tokens.std(correction=0).item())
    assert result.metrics["turn/total_turns"] == 5.0
    assert result.metrics["turn/num_samples_without_turns"] == 0.0
    assert "residual/b_loo_mean" in result.metrics
    # Whitening runs over response tokens only; everything else stays 0.
    valid = result.advantages[batch["token_mask"].bool()]
    assert abs(valid.mean().item()) < 1e-6
    assert bool((result.advantages[~spans.turn_index.ge(0)] == 0).all())


def test_turn_mode_metrics_respect_the_sample_mask() -> None:
    batch = _turn_batch()
    batch["sample_mask"] = torch.tensor([1.0, 0.0, 1.0])
    result = compute_advantages(TURN_GAE, **batch)
    assert result.metrics["turn/total_turns"] == 4.0
    assert result.metrics["turn/num_turns_mean"] == 2.0
    assert bool((result.advantages[1] == 0).all())
