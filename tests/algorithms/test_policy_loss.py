"""Clipped PPO policy loss: hand-computed clip / IS / aggregation / KL cases, micro-batch invariance, reducer."""

import math

import pytest
import torch

from asyncppo.algorithms.microbatch import loss_normalizers, reduce_microbatch_metrics
from asyncppo.algorithms.mismatch import token_mismatch_metrics
from asyncppo.algorithms.policy_loss import policy_loss
from asyncppo.config.losses import PolicyLossConfig

pytestmark = pytest.mark.usefixtures("float64")


BASE = PolicyLossConfig()
"""The schema's loss_fn defaults: clip 0.2 both ways, no KL terms, no importance-sampling correction."""


def settings(**overrides: object) -> PolicyLossConfig:
    return PolicyLossConfig.model_validate(overrides)


def with_column0(tokens: torch.Tensor, fill: float = math.nan) -> torch.Tensor:
    """Prepend the position-0 column (which holds no logprob) filled with garbage: it must never leak."""
    return torch.cat([torch.full((tokens.shape[0], 1), fill), tokens], dim=1)


def run(
    cfg: PolicyLossConfig,
    curr: torch.Tensor,
    old: torch.Tensor,
    adv: torch.Tensor,
    mask: torch.Tensor | None = None,
    sample_mask: torch.Tensor | None = None,
    gen: torch.Tensor | None = None,
    ref: torch.Tensor | None = None,
    rewards: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Policy loss on token-aligned [B, T] inputs; the counts are those of the whole (single) batch."""
    mask = torch.ones_like(old) if mask is None else mask
    sample_mask = torch.ones(old.shape[0]) if sample_mask is None else sample_mask
    token_mask = with_column0(mask, fill=1.0)  # a 1 at column 0 must be ignored too
    counts = loss_normalizers(token_mask, sample_mask, rewards)
    return policy_loss(
        cfg,
        logprobs=with_column0(curr),
        old_logprobs=with_column0(old),
        generation_logprobs=None if gen is None else with_column0(gen),
        advantages=with_column0(adv),
        token_mask=token_mask,
        sample_mask=sample_mask,
        global_valid_tokens=counts.valid_tokens,
        global_valid_seqs=counts.valid_seqs,
        reference_logprobs=None if ref is None else with_column0(ref),
        rewards=rewards,
        global_positive_tokens=counts.positive_tokens,
    )


def log_of(*ratios: float) -> torch.Tensor:
    return torch.tensor([ratios]).log()


def test_symmetric_clip_matches_hand_computation_and_cuts_gradient_of_clipped_tokens():
    # eps = 0.2, old = 0 so r = exp(curr):
    #   r=0.5 A=+1: max(-0.5, -0.8) = -0.5          r=1.1 A=+1: -1.1 (inside)
    #   r=1.5 A=+1: max(-1.5, -1.2) = -1.2 (clipped) r=1.5 A=-1: max(1.5, 1.2) = 1.5
    # loss = (-0.5 - 1.1 - 1.2 + 1.5) / 4 = -0.325; d/dlogpi = -A r / 4 where unclipped, 0 where clipped.
    curr = log_of(0.5, 1.1, 1.5, 1.5).requires_grad_()
    loss, metrics = run(BASE, curr, torch.zeros(1, 4), torch.tensor([[1.0, 1.0, 1.0, -1.0]]))
    loss.backward()
    assert loss.item() == pytest.approx(-0.325)
    assert curr.grad is not None
    torch.testing.assert_close(curr.grad, torch.tensor([[-0.125, -0.275, 0.0, 0.375]]))
    assert metrics["clipfrac"] == pytest.approx(0.25)
    assert metrics["probs_ratio"] == pytest.approx((0.5 + 1.1 + 1.5 + 1.5) / 4)
    assert metrics["probs_ratio_clamped"] == pytest.approx((0.8 + 1.1 + 1.2 + 1.2) / 4)
    assert (metrics["probs_ratio_min"], metrics["probs_ratio_max"]) == pytest.approx((0.5, 1.5))
    assert (metrics["probs_ratio_clamped_min"], metrics["probs_ratio_clamped_max"]) == pytest.approx((0.8, 1.2))


def test_asymmetric_clip_uses_separate_lower_and_upper_bounds():
    # bounds [1 - 0.1, 1 + 0.3] = [0.9, 1.3]:
    #   r=0.85 A=-1: max(0.85, 0.9) = 0.9 (clipped)   r=1.25 A=+1: -1.25 (inside; a symmetric 0.2 would clip it)
    #   r=1.4  A=+1: max(-1.4, -1.3) = -1.3 (clipped)
    # loss = (0.9 - 1.25 - 1.3) / 3 = -0.55
    loss, metrics = run(
        settings(ratio_clip_min=0.1, ratio_clip_max=0.3),
        log_of(0.85, 1.25, 1.4),
        torch.zeros(1, 3),
        torch.tensor([[-1.0, 1.0, 1.0]]),
    )
    assert loss.item() == pytest.approx(-0.55)
    assert metrics["clipfrac"] == pytest.approx(2 / 3)


def test_dual_clip_bounds_negative_advantage_tokens_only():
    # c = 3, eps = 0.2:
    #   r=5 A=-1: max(5, 1.2) = 5, dual min(5, 3) = 3 (no gradient)
    #   r=2 A=-1: max(2, 1.2) = 2, min(2, 3) = 2 (gradient -A r / 3 = 2/3)
    #   r=5 A=+1: max(-5, -1.2) = -1.2 (ordinary clip; dual clip not applied for A > 0)
    # loss = (3 + 2 - 1.2) / 3 = 3.8 / 3
    curr = log_of(5.0, 2.0, 5.0).requires_grad_()
    loss, metrics = run(settings(ratio_clip_c=3.0), curr, torch.zeros(1, 3), torch.tensor([[-1.0, -1.0, 1.0]]))
    loss.backward()
    assert loss.item() == pytest.approx(3.8 / 3)
    assert curr.grad is not None
    torch.testing.assert_close(curr.grad, torch.tensor([[0.0, 2 / 3, 0.0]]))
    assert metrics["clipfrac"] == pytest.approx(2 / 3)


@pytest.mark.parametrize("bad_c", [1.0, 0.5])
def test_dual_clip_constant_must_exceed_one(bad_c: float):
    with pytest.raises(ValueError, match="ratio_clip_c"):
        settings(ratio_clip_c=bad_c)


def test_sequence_level_ratios_require_sequence_level_loss():
    with pytest.raises(ValueError, match="token_level_loss"):
        settings(sequence_level_importance_ratios=True, token_level_loss=True)


def test_truncation_requires_importance_sampling_and_bounds():
    with pytest.raises(ValueError, match="use_importance_sampling_correction"):
        settings(truncated_importance_sampling_type="tis", truncated_importance_sampling_ratio=5.0)
    with pytest.raises(ValueError, match=r"ratio_min: required when"):
        settings(
            use_importance_sampling_correction=True,
            truncated_importance_sampling_type="icepop",
            truncated_importance_sampling_ratio=5.0,
        )


# IS weights w = exp(old - gen), with curr = old (r = 1) and A = 1 so each token's loss is -w:
#   seq 0: w = [0.1, 0.5] (geometric mean sqrt(0.05) = 0.224, inside [0.2, 5])
#   seq 1: w = [2, 20]    (geometric mean sqrt(40) = 6.32, outside)
IS_WEIGHTS = torch.tensor([[0.1, 0.5], [2.0, 20.0]])


@pytest.mark.parametrize(
    ("kind", "low", "expected_weight_sum"),
    [
        (None, None, 0.1 + 0.5 + 2 + 20),
        ("tis", 0.2, 0.2 + 0.5 + 2 + 5),  # clamp to [0.2, 5]
        ("tis", None, 0.1 + 0.5 + 2 + 5),  # no lower bound -> [0, 5]
        ("icepop", 0.2, 0.5 + 2),  # tokens outside [0.2, 5] zeroed
        ("seq-mask-tis", 0.2, 0.1 + 0.5),  # sequence 1 dropped whole, seq 0 keeps its untruncated weights
    ],
)
def test_truncated_importance_sampling_variants(kind: str | None, low: float | None, expected_weight_sum: float):
    cfg = settings(
        use_importance_sampling_correction=True,
        truncated_importance_sampling_type=kind,
        truncated_importance_sampling_ratio=None if kind is None else 5.0,
        truncated_importance_sampling_ratio_min=low,
    )
    curr = torch.zeros(2, 2, requires_grad=True)
    loss, metrics = run(cfg, curr, torch.zeros(2, 2), torch.ones(2, 2), gen=-IS_WEIGHTS.log())
    loss.backward()
    assert loss.item() == pytest.approx(-expected_weight_sum / 4)
    assert metrics["sampling_importance_ratio"] == pytest.approx(expected_weight_sum / 4)
    assert curr.grad is not None  # weights scale the gradient (-A w r / N) and are not differentiated
    assert curr.grad.sum().item() == pytest.approx(-expected_weight_sum / 4)
    if kind == "seq-mask-tis":
        assert metrics["is_oob_ratio"] == pytest.approx(0.5)
    else:
        assert "is_oob_ratio" not in metrics


def test_sequence_level_importance_weights_multiply_token_ratios():
    # Sequence-level: w_i = exp(sum_t(old - gen)) = 0.1 * 0.5 = 0.05 and 2 * 20 = 40; each sequence's mean loss
    # is -w_i, averaged over the 2 sequences: -(0.05 + 40) / 2.
    cfg = settings(
        use_importance_sampling_correction=True, sequence_level_importance_ratios=True, token_level_loss=False
    )
    loss, _ = run(cfg, torch.zeros(2, 2), torch.zeros(2, 2), torch.ones(2, 2), gen=-IS_WEIGHTS.log())
    assert loss.item() == pytest.approx(-(0.05 + 40) / 2)


def test_non_finite_importance_weights_become_zero():
    # gen = NaN -> w = NaN -> 0; gen = -1e4 -> w = exp(1e4) = inf -> 0; the third token keeps w = 1.
    cfg = settings(use_importance_sampling_correction=True)
    gen = torch.tensor([[math.nan, -1e4, 0.0]])
    loss, metrics = run(cfg, torch.zeros(1, 3), torch.zeros(1, 3), torch.ones(1, 3), gen=gen)
    assert loss.item() == pytest.approx(-1 / 3)
    assert metrics["sampling_importance_ratio"] == pytest.approx(1 / 3)


def test_an_all_masked_global_batch_is_an_error_not_a_nan():
    with pytest.raises(ValueError, match="no valid token"):
        run(BASE, torch.zeros(1, 2), torch.zeros(1, 2), torch.ones(1, 2), mask=torch.zeros(1, 2))


def test_importance_sampling_needs_generation_logprobs():
    with pytest.raises(ValueError, match="generation_logprobs"):
        run(settings(use_importance_sampling_correction=True), torch.zeros(1, 2), torch.zeros(1, 2), torch.ones(1, 2))


# r = 1 so each token's loss is -A. seq 0: one token, A = 4; seq 1: three tokens, A = [1, 2, 3] (last col padding).
AGG_ADV = torch.tensor([[4.0, 0.0, 0.0], [1.0, 2.0, 3.0]])
AGG_MASK = torch.tensor([[1.0, 0.0, 0.0], [1.0, 1.0, 1.0]])


@pytest.mark.parametrize(
    ("token_level", "sample_mask", "expected"),
    [
        (True, [1.0, 1.0], -(4 + 1 + 2 + 3) / 4),  # token mean
        (False, [1.0, 1.0], -(4 + 2) / 2),  # sequence means -4 and -2, averaged
        (True, [1.0, 0.5], -(4 + 0.5 * 6) / (1 + 0.5 * 3)),  # fractional sample_mask weights tokens...
        (False, [1.0, 0.5], -(1 * 4 + 0.5 * 2) / 1.5),  # ...and sequences, and the counts
    ],
)
def test_token_and_sequence_level_aggregation(token_level: bool, sample_mask: list[float], expected: float):
    cfg = settings(token_level_loss=token_level)
    zeros = torch.zeros(2, 3)
    loss, _ = run(cfg, zeros, zeros, AGG_ADV, mask=AGG_MASK, sample_mask=torch.tensor(sample_mask))
    assert loss.item() == pytest.approx(expected)


def test_gspo_uses_the_sequence_geometric_mean_ratio():
    # log-ratios [0.1, 0.3] -> one ratio exp(0.2) = 1.2214 for both tokens. A = -1: max(1.2214, 1.2) = 1.2214
    # (unclipped), loss = 1.2214; gradient of exp(mean) is r / 2 per token. Token ratios would give
    # (max(1.105, 1.2) + max(1.35, 1.2)) / 2 = 1.275 instead.
    cfg = settings(sequence_level_importance_ratios=True, token_level_loss=False)
    curr = torch.tensor([[0.1, 0.3]], requires_grad=True)
    loss, _ = run(cfg, curr, torch.zeros(1, 2), -torch.ones(1, 2))
    loss.backward()
    assert loss.item() == pytest.approx(math.exp(0.2))
    assert curr.grad is not None
    torch.testing.assert_close(curr.grad, torch.full((1, 2), math.exp(0.2) / 2))


# log_ratio = ref - curr = [0.5, -1, 30]; input clamp 20 -> [0.5, -1, 20]; output clamp 10.
#   k1 = -lr            = [-0.5, 1, -20 -> -10]              mean -9.5 / 3
#   k2 = lr^2 / 2       = [0.125, 0.5, 200 -> 10]             mean 10.625 / 3
#   k3 = e^lr - 1 - lr  = [0.148721, 0.367879, 4.85e8 -> 10]  mean 10.516600 / 3
# Without the output clamp, k2's last token stays 200: mean 200.625 / 3.
@pytest.mark.parametrize(
    ("kl_type", "output_clamp", "expected_mean"),
    [
        ("k1", 10.0, -9.5 / 3),
        ("k2", 10.0, 10.625 / 3),
        ("k3", 10.0, (math.exp(0.5) - 1.5 + math.exp(-1) + 10) / 3),
        ("k2", None, 200.625 / 3),
    ],
)
def test_reference_kl_types_with_clamps(kl_type: str, output_clamp: float | None, expected_mean: float):
    cfg = settings(
        reference_policy_kl_penalty=0.1, reference_policy_kl_type=kl_type, kl_output_clamp_value=output_clamp
    )
    zeros = torch.zeros(1, 3)  # A = 0: the actor term is 0 and the loss is the KL term alone
    loss, metrics = run(cfg, zeros, zeros, zeros, ref=torch.tensor([[0.5, -1.0, 30.0]]))
    assert loss.item() == pytest.approx(0.1 * expected_mean)
    assert metrics["kl_penalty"] == pytest.approx(0.1 * expected_mean)
    assert metrics["actor_loss"] == 0.0


def test_reference_kl_gradient_carries_the_score_function_term():
    # rho = exp(curr - sg(curr)) adds k * grad(logpi): d/dcurr [rho k3] = k3 + dk3/dcurr
    #   = (e^lr - 1 - lr) - (e^lr - 1) = -lr with lr = ref - curr. lr = [0.5, -1], beta = 0.1, N = 2:
    # grad = 0.1 * [-0.5, 1] / 2.
    cfg = settings(reference_policy_kl_penalty=0.1)
    curr = torch.zeros(1, 2, requires_grad=True)
    loss, _ = run(cfg, curr, torch.zeros(1, 2), torch.zeros(1, 2), ref=torch.tensor([[0.5, -1.0]]))
    loss.backward()
    assert curr.grad is not None
    torch.testing.assert_close(curr.grad, torch.tensor([[-0.025, 0.05]]))


def test_on_policy_kl_approximation_weights_by_current_over_generation():
    # rho = exp(curr - gen) = exp(0 - log 0.5) = 2; k1 = -(ref - curr) = -0.5; loss = 0.1 * 2 * -0.5.
    cfg = settings(reference_policy_kl_penalty=0.1, reference_policy_kl_type="k1", use_on_policy_kl_approximation=True)
    zeros = torch.zeros(1, 1)
    loss, _ = run(cfg, zeros, zeros, zeros, gen=log_of(0.5), ref=torch.tensor([[0.5]]))
    assert loss.item() == pytest.approx(-0.1)


def test_kl_in_reward_removes_the_loss_kl_term():
    cfg = settings(reference_policy_kl_penalty=0.1, use_kl_in_reward=True)
    zeros = torch.zeros(1, 2)
    loss, metrics = run(cfg, zeros, zeros, torch.ones(1, 2))  # no reference logprobs needed
    assert loss.item() == pytest.approx(-1.0)
    assert metrics["kl_penalty"] == 0.0


def test_behaviour_kl_is_kl_from_generator_to_current_without_is_weights():
    # KL(pi_gen || pi_theta) with lr = curr - gen = [-0.5, 0.2]: k3 = [e^-0.5 - 0.5, e^0.2 - 1.2] = [0.106531, 0.021403]
    # mean 0.063967 * 0.5. IS correction is on (w = exp(old - gen) != 1) and A = 0: the term must not be weighted.
    cfg = settings(behaviour_kl_penalty=0.5, use_importance_sampling_correction=True)
    zeros = torch.zeros(1, 2)
    loss, metrics = run(cfg, zeros, zeros, zeros, gen=torch.tensor([[0.5, -0.2]]))
    expected = 0.5 * ((math.exp(-0.5) - 0.5) + (math.exp(0.2) - 1.2)) / 2
    assert loss.item() == pytest.approx(expected)
    assert metrics["behaviour_kl"] == pytest.approx(expected)


def test_positive_example_nll_averages_over_tokens_of_rewarded_samples():
    # rewards [1, 0]: only seq 0 counts. -logpi = [log 2, log 4] -> mean 1.5 log 2; mu = 0.1. A = 0.
    cfg = settings(positive_example_nll_weight=0.1)
    curr = log_of(0.5, 0.25, 0.1, 0.1).reshape(2, 2)
    loss, metrics = run(cfg, curr, curr.clone(), torch.zeros(2, 2), rewards=torch.tensor([1.0, 0.0]))
    assert loss.item() == pytest.approx(0.1 * 1.5 * math.log(2))
    assert metrics["positive_nll_loss"] == pytest.approx(0.1 * 1.5 * math.log(2))
    with pytest.raises(ValueError, match="rewards"):
        run(cfg, curr, curr.clone(), torch.zeros(2, 2))


@pytest.mark.parametrize("switch", ["disable_ppo_ratio", "force_on_policy_ratio"])
def test_disable_or_force_on_policy_ratio_is_reinforce(switch: str):
    # L = -A exp(logpi - sg(logpi)): value -A, gradient -A grad(logpi), no clipping even at r = 3.
    curr = log_of(3.0, 0.2).requires_grad_()
    loss, metrics = run(settings(**{switch: True}), curr, torch.zeros(1, 2), torch.tensor([[1.0, 2.0]]))
    loss.backward()
    assert loss.item() == pytest.approx(-1.5)
    assert curr.grad is not None
    torch.testing.assert_close(curr.grad, torch.tensor([[-0.5, -1.0]]))
    assert metrics["clipfrac"] == 0.0


def test_metrics_cover_the_seed_set_and_terms_add_up_to_the_loss():
    cfg = settings(
        ratio_clip_c=3.0,
        reference_policy_kl_penalty=0.05,
        behaviour_kl_penalty=0.1,
        positive_example_nll_weight=0.2,
        use_importance_sampling_correction=True,
        truncated_importance_sampling_type="seq-mask-tis",
        truncated_importance_sampling_ratio=5.0,
        truncated_importance_sampling_ratio_min=0.2,
    )
    generator = torch.Generator().manual_seed(0)
    curr, old, gen, ref, adv = (torch.randn(3, 4, generator=generator) * 0.3 - 1 for _ in range(5))
    loss, metrics = run(cfg, curr, old, adv, gen=gen, ref=ref, rewards=torch.tensor([1.0, 0.0, 1.0]))
    seed_keys = [
        "loss",
        "actor_loss",
        "probs_ratio",
        "probs_ratio_clamped",
        "probs_ratio_min",
        "probs_ratio_max",
        "kl_penalty",
        "behaviour_kl",
        "token_mult_prob_error",
        "gen_kl_error",
        "policy_kl_error",
        "js_divergence_error",
        "sampling_importance_ratio",
        "num_valid_samples",
        "approx_entropy",
        "is_oob_ratio",
        "positive_nll_loss",
        "clipfrac",
    ]
    assert set(seed_keys) <= set(metrics)
    parts = metrics["actor_loss"] + metrics["kl_penalty"] + metrics["behaviour_kl"] + metrics["positive_nll_loss"]
    assert metrics["loss"] == pytest.approx(parts)
    assert metrics["loss"] == pytest.approx(loss.item())
    assert metrics["num_valid_samples"] == 3
    # one implementation of each mismatch metric: the loss reports exactly mismatch.token_mismatch_metrics
    expected = token_mismatch_metrics(old, gen, torch.ones(3, 4), 12.0, "k3")
    for key, value in expected.items():
        assert metrics[key] == pytest.approx(value)


# ---- micro-batch invariance -------------------------------------------------------------------------------------

B, S, F, V = 6, 9, 4, 5


def _global_batch() -> dict[str, torch.Tensor]:
    """A ragged global batch: prompts of 2-3 tokens, responses of 1-6, padding; one sequence fully masked by
    sample_mask and one at weight 0.5."""
    generator = torch.Generator().manual_seed(1)
    token_mask = torch.zeros(B, S)
    for row, (start, end) in enumerate([(2, 8), (3, 4), (2, 9), (3, 7), (2, 5), (3, 9)]):
        token_mask[row, start:end] = 1.0
    return {
        "features": torch.randn(B, S, F, generator=generator),
        "tokens": torch.randint(0, V, (B, S), generator=generator),
        "old_noise": 0.2 * torch.randn(B, S, generator=generator),
        "gen_noise": 0.3 * torch.randn(B, S, generator=generator),
        "ref_noise": 0.3 * torch.randn(B, S, generator=generator),
        "advantages": torch.randn(B, S, generator=generator),
        "token_mask": token_mask,
        "sample_mask": torch.tensor([0.0, 1.0, 0.5, 1.0, 1.0, 1.0]),
        "rewards": torch.tensor([1.0, 0.0, 1.0, 1.0, 0.0, 1.0]),
    }


def _loss_over_splits(cfg: PolicyLossConfig, splits: list[int]) -> tuple[float, torch.Tensor, dict[str, float]]:
    """Sum of micro-batch losses, the accumulated gradient of a tiny policy, and the reduced metrics."""
    torch.manual_seed(0)
    policy = torch.nn.Linear(F, V)
    data = _global_batch()
    counts = loss_normalizers(data["token_mask"], data["sample_mask"], data["rewards"])
    total, metrics, start = 0.0, [], 0
    for size in splits:
        rows = slice(start, start + size)
        start += size
        logits = policy(data["features"][rows])
        logprobs = torch.log_softmax(logits, dim=-1).gather(-1, data["tokens"][rows, :, None]).squeeze(-1)
        old = logprobs.detach() + data["old_noise"][rows]
        loss, micro_metrics = policy_loss(
            cfg,
            logprobs=logprobs,
            old_logprobs=old,
            generation_logprobs=old + data["gen_noise"][rows],
            advantages=data["advantages"][rows],
            token_mask=data["token_mask"][rows],
            sample_mask=data["sample_mask"][rows],
            global_valid_tokens=counts.valid_tokens,
            global_valid_seqs=counts.valid_seqs,
            reference_logprobs=old + data["ref_noise"][rows],
            rewards=data["rewards"][rows],
            global_positive_tokens=counts.positive_tokens,
        )
        loss.backward()
        total += loss.item()
        metrics.append(micro_metrics)
    gradient = torch.cat([parameter.grad.flatten() for parameter in policy.parameters() if parameter.grad is not None])
    return total, gradient, reduce_microbatch_metrics(metrics)


INVARIANCE_SETTINGS = {
    "token_level": settings(),
    "sequence_level": settings(token_level_loss=False),
    "gspo_with_sequence_is": settings(
        token_level_loss=False,
        sequence_level_importance_ratios=True,
        use_importance_sampling_correction=True,
        reference_policy_kl_penalty=0.1,
    ),
    "token_is_kl_nll": settings(
        ratio_clip_c=3.0,
        use_importance_sampling_correction=True,
        truncated_importance_sampling_type="tis",
        truncated_importance_sampling_ratio=1.2,
        truncated_importance_sampling_ratio_min=0.9,
        reference_policy_kl_penalty=0.1,
        use_on_policy_kl_approximation=True,
        behaviour_kl_penalty=0.2,
        positive_example_nll_weight=0.3,
    ),
    "sequence_level_seq_mask_tis_kl": settings(
        token_level_loss=False,
        use_importance_sampling_correction=True,
        truncated_importance_sampling_type="seq-mask-tis",
        truncated_importance_sampling_ratio=1.1,
        truncated_importance_sampling_ratio_min=0.9,
        reference_policy_kl_penalty=0.1,
        reference_policy_kl_type="k2",
        behaviour_kl_penalty=0.2,
    ),
}


@pytest.mark.parametrize("name", list(INVARIANCE_SETTINGS))
@pytest.mark.parametrize("splits", [[2, 2, 2], [1, 5], [4, 1, 1], [1] * 6], ids=str)
def test_loss_gradient_and_metrics_do_not_depend_on_micro_batch_split(name: str, splits: list[int]):
    cfg = INVARIANCE_SETTINGS[name]
    whole_loss, whole_gradient, whole_metrics = _loss_over_splits(cfg, [B])
    loss, gradient, metrics = _loss_over_splits(cfg, splits)
    assert loss == pytest.approx(whole_loss, abs=1e-6)
    torch.testing.assert_close(gradient, whole_gradient, atol=1e-6, rtol=0.0)
    assert metrics.keys() == whole_metrics.keys()
    for key, value in whole_metrics.items():
        assert metrics[key] == pytest.approx(value, abs=1e-6), key
    assert whole_gradient.abs().sum() > 0  # the check is not vacuous
    assert whole_metrics["clipfrac"] > 0 or name == "gspo_with_sequence_is"


# ---- reducer and normalisers ------------------------------------------------------------------------------------


def test_reducer_sums_contributions_and_takes_extremes_ignoring_infinities():
    reduced = reduce_microbatch_metrics(
        [
            {"loss": 0.25, "probs_ratio_min": 0.8, "probs_ratio_max": 1.3, "only_here": 2.0},
            {"loss": 0.5, "probs_ratio_min": math.inf, "probs_ratio_max": -math.inf},  # no valid token
            {"loss": -0.125, "probs_ratio_min": 0.7, "probs_ratio_max": 1.1},
        ]
    )
    assert reduced == {"loss": 0.625, "probs_ratio_min": 0.7, "probs_ratio_max": 1.3, "only_here": 2.0}


def test_reducer_reports_minus_one_when_no_micro_batch_had_a_valid_token():
    reduced = reduce_microbatch_metrics([{"values_min": math.inf, "values_max": -math.inf}] * 2)
    assert reduced == {"values_min": -1.0, "values_max": -1.0}


def test_loss_normalizers_drop_column_zero_and_weight_by_sample_mask():
    # row 0: tokens at 1, 2 (column 0 ignored) weight 1; row 1: tokens at 1, 2, 3 weight 0.5 -> 2 + 1.5 = 3.5.
    # positive tokens: only row 1 has reward > 0 -> 1.5. seqs: 1 + 0.5.
    token_mask = torch.tensor([[1.0, 1.0, 1.0, 0.0], [0.0, 1.0, 1.0, 1.0]])
    counts = loss_normalizers(token_mask, torch.tensor([1.0, 0.5]), torch.tensor([0.0, 0.3]))
    assert (counts.valid_tokens, counts.valid_seqs, counts.positive_tokens) == (3.5, 1.5, 1.5)
