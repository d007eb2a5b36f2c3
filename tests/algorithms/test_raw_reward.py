"""raw_reward: broadcast and group normalisation by hand, no critic (no returns, no value model)."""

import pytest
import torch

from asyncppo.algorithms.advantages import compute_advantages
from asyncppo.algorithms.raw_reward import raw_reward_advantages
from asyncppo.config.ppo import AdvEstimatorConfig

MASK = torch.tensor([[0.0, 1.0, 1.0, 0.0], [0.0, 1.0, 0.0, 0.0], [1.0, 1.0, 1.0, 1.0], [0.0, 0.0, 1.0, 1.0]])
REWARDS = torch.tensor([1.0, 0.0, 0.0, 0.0])
GROUPS = torch.tensor([0, 0, 0, 0])


def _settings(**overrides: object) -> AdvEstimatorConfig:
    fields: dict[str, object] = {"name": "raw_reward", "normalize_advantages": False, **overrides}
    return AdvEstimatorConfig(**fields)  # type: ignore[arg-type]


def test_raw_reward_broadcasts_over_the_response_and_has_no_returns() -> None:
    result = compute_advantages(
        _settings(),
        rewards=torch.tensor([2.0, -1.0, 0.5, 0.0]),
        values=None,
        token_mask=MASK,
        sample_mask=torch.ones(4),
        group_ids=GROUPS,
    )
    assert torch.equal(result.advantages, torch.tensor([2.0, -1.0, 0.5, 0.0]).unsqueeze(1) * MASK)
    assert result.returns is None and result.critic_mask is None
    assert torch.equal(result.returns_to_abs, torch.zeros(4))


@pytest.mark.parametrize(
    ("baseline", "normalize_by_std", "expected"),
    [
        # mean of [1, 0, 0, 0] is 0.25: [0.75, -0.25, -0.25, -0.25].
        ("mean", False, [0.75, -0.25, -0.25, -0.25]),
        # leave-one-out: B = [0, 1/3, 1/3, 1/3].
        ("leave_one_out", False, [1.0, -1 / 3, -1 / 3, -1 / 3]),
        # unbiased std: squared deviations 0.5625 + 3 * 0.0625 = 0.75, / 3 = 0.25 -> std 0.5.
        ("mean", True, [1.5, -0.5, -0.5, -0.5]),
        ("leave_one_out", True, [2.0, -2 / 3, -2 / 3, -2 / 3]),
    ],
)
def test_group_normalised_raw_reward(baseline: str, normalize_by_std: bool, expected: list[float]) -> None:
    advantages = raw_reward_advantages(REWARDS, MASK, GROUPS, baseline, normalize_by_std, 1e-9)  # type: ignore[arg-type]
    torch.testing.assert_close(advantages, torch.tensor(expected).unsqueeze(1) * MASK)


def test_groups_are_normalised_separately_and_singletons_get_zero() -> None:
    # Group 0 = [1, 0] (mean 0.5, std 0.7071), group 1 = [3] alone: R - mean = 0, std 0 -> 0 / eps = 0.
    advantages = raw_reward_advantages(
        torch.tensor([1.0, 0.0, 3.0]), torch.ones(3, 1), torch.tensor([0, 0, 1]), "mean", True, 1e-6
    )
    half_over_std = 0.5 / (0.5**0.5 + 1e-6)
    torch.testing.assert_close(advantages[:, 0], torch.tensor([half_over_std, -half_over_std, 0.0]))


def test_invalid_raw_reward_options_raise() -> None:
    with pytest.raises(ValueError, match="needs group_ids"):
        raw_reward_advantages(REWARDS, MASK, None, "mean", False, 1e-6)


def test_raw_reward_runs_without_a_critic() -> None:
    assert _settings().uses_critic is False
    with pytest.raises(ValueError, match="pass values=None"):
        compute_advantages(
            _settings(),
            rewards=REWARDS,
            values=torch.zeros(4, 4),
            token_mask=MASK,
            sample_mask=torch.ones(4),
            group_ids=GROUPS,
        )


def test_raw_reward_whitening_uses_the_advantage_mask() -> None:
    # Sample 3 is masked: its reward 100 must not move the statistics of the others.
    rewards = torch.tensor([1.0, 0.0, 0.5, 100.0])
    result = compute_advantages(
        _settings(normalize_advantages=True),
        rewards=rewards,
        values=None,
        token_mask=MASK,
        sample_mask=torch.tensor([1.0, 1.0, 1.0, 0.0]),
        group_ids=GROUPS,
    )
    # Valid tokens: 2 x 1.0, 1 x 0.0, 4 x 0.5 -> mean 4/7.
    valid = result.advantages[:3][MASK[:3].bool()]
    assert abs(valid.mean().item()) < 1e-6
    assert bool((result.advantages[3] == 0).all())
    assert result.metrics["adv_raw/mean"] == pytest.approx(4 / 7)
