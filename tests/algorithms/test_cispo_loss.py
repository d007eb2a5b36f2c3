"""CISPO policy loss (loss_fn.use_cispo): hand-computed loss values and gradients, and its load-time rules.

L_t = -sg(clip(r_t, 1 - ratio_clip_min, 1 + ratio_clip_max)) * A_t * logpi_t, so dL/dlogpi_t = -clip(r_t) A_t:
unlike PPO's clip, a clipped token keeps a gradient (with the clipped weight). The numbers below were worked out
with plain Python floats (math.log), never by calling the implementation.
"""

import math

import pytest
import torch

from asyncppo.algorithms.microbatch import loss_normalizers
from asyncppo.algorithms.policy_loss import policy_loss
from asyncppo.config.losses import PolicyLossConfig

pytestmark = pytest.mark.usefixtures("float64")


def with_column0(tokens: torch.Tensor, fill: float) -> torch.Tensor:
    """Prepend the position-0 column (which holds no logprob): its contents must never leak into the loss."""
    return torch.cat([torch.full((tokens.shape[0], 1), fill), tokens], dim=1)


def run(
    cfg: PolicyLossConfig,
    curr: torch.Tensor,
    adv: torch.Tensor,
    mask: torch.Tensor,
    gen: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """The policy loss of one whole batch, with old logprobs 0 (so r = exp(curr)); inputs [B, T] token-aligned."""
    token_mask = with_column0(mask, fill=1.0)
    sample_mask = torch.ones(curr.shape[0])
    counts = loss_normalizers(token_mask, sample_mask, None)
    return policy_loss(
        cfg,
        logprobs=with_column0(curr, fill=math.nan),
        old_logprobs=with_column0(torch.zeros_like(mask), fill=math.nan),
        generation_logprobs=None if gen is None else with_column0(gen, fill=math.nan),
        advantages=with_column0(adv, fill=math.nan),
        token_mask=token_mask,
        sample_mask=sample_mask,
        global_valid_tokens=counts.valid_tokens,
        global_valid_seqs=counts.valid_seqs,
    )


def test_cispo_token_level_loss_and_gradient_keep_clipped_tokens():
    # eps = 0.2 both ways; r = [0.5, 1.1, 1.5, 1.5], A = [+1, +1, +1, -1]; clip(r) = [0.8, 1.1, 1.2, 1.2].
    # L = -clip(r) A log(r):
    #   -0.8 * 1 * log(0.5)  =  0.5545177444479562
    #   -1.1 * 1 * log(1.1)  = -0.10484119778475744
    #   -1.2 * 1 * log(1.5)  = -0.48655812972979723
    #   -1.2 * -1 * log(1.5) =  0.48655812972979723
    # loss = sum / 4 = 0.1124191366657997
    # dL/dlogpi = -clip(r) A / 4 = [-0.2, -0.275, -0.3, 0.3] (PPO's clip would give 0 to the third token).
    curr = torch.tensor([[math.log(0.5), math.log(1.1), math.log(1.5), math.log(1.5)]], requires_grad=True)
    loss, metrics = run(PolicyLossConfig(use_cispo=True), curr, torch.tensor([[1.0, 1.0, 1.0, -1.0]]), torch.ones(1, 4))
    loss.backward()
    assert loss.item() == pytest.approx(0.1124191366657997, abs=1e-15)
    assert curr.grad is not None
    torch.testing.assert_close(curr.grad, torch.tensor([[-0.2, -0.275, -0.3, 0.3]]), rtol=0, atol=1e-15)
    # For CISPO clipfrac counts tokens whose weight the clip changed (0.5, 1.5, 1.5): 3 of 4.
    assert metrics["clipfrac"] == pytest.approx(0.75)
    assert metrics["probs_ratio_clamped"] == pytest.approx((0.8 + 1.1 + 1.2 + 1.2) / 4)
    assert metrics["actor_loss"] == pytest.approx(0.1124191366657997, abs=1e-15)


def test_cispo_sequence_level_with_importance_weights_asymmetric_clip_and_a_masked_token():
    # clip to [1 - 0.1, 1 + 0.3] = [0.9, 1.3]; token_level_loss false; IS weight w = exp(old - gen) = exp(-gen).
    # sequence 1: r = [1.5, 0.7], A = [2, 2], gen = [log 2, 0] -> w = [0.5, 1], clip(r) = [1.3, 0.9]
    #   L = -w clip(r) A log(r) = [-0.5*1.3*2*log(1.5), -1*0.9*2*log(0.7)]
    #     = [-0.5271046405406137, 0.6420148990897184], sequence mean 0.05745512927455235
    # sequence 2: r = [1.0, masked], A = -1, w = 1: L = -1 * 1.0 * -1 * log(1) = 0 (its gradient is not 0)
    # loss = (0.05745512927455235 + 0) / 2 sequences = 0.028727564637276187
    # dL/dlogpi = -w clip(r) A / (tokens of the sequence * 2 sequences):
    #   [-0.5*1.3*2/4, -0.9*2/4] = [-0.325, -0.45];  [1/2, 0 (masked)] = [0.5, 0.0]
    cfg = PolicyLossConfig(
        use_cispo=True,
        ratio_clip_min=0.1,
        ratio_clip_max=0.3,
        token_level_loss=False,
        use_importance_sampling_correction=True,
    )
    curr = torch.tensor([[math.log(1.5), math.log(0.7)], [0.0, 0.0]], requires_grad=True)
    loss, metrics = run(
        cfg,
        curr,
        torch.tensor([[2.0, 2.0], [-1.0, -1.0]]),
        torch.tensor([[1.0, 1.0], [1.0, 0.0]]),
        gen=torch.tensor([[math.log(2.0), 0.0], [0.0, 0.0]]),
    )
    loss.backward()
    assert loss.item() == pytest.approx(0.028727564637276187, abs=1e-15)
    assert curr.grad is not None
    torch.testing.assert_close(curr.grad, torch.tensor([[-0.325, -0.45], [0.5, 0.0]]), rtol=0, atol=1e-15)
    assert metrics["clipfrac"] == pytest.approx(2 / 3)  # 1.5 and 0.7 clipped, 1.0 not; 3 valid tokens


@pytest.mark.parametrize(
    ("other", "named"),
    [
        ({"disable_ppo_ratio": True}, "use_cispo"),
        ({"force_on_policy_ratio": True}, "use_cispo"),
        ({"ratio_clip_c": 3.0}, "ratio_clip_c"),
    ],
)
def test_cispo_refuses_options_that_redefine_the_surrogate(other: dict[str, object], named: str):
    with pytest.raises(ValueError, match=named):
        PolicyLossConfig.model_validate({"use_cispo": True, **other})


def test_cispo_combines_with_importance_sampling_and_gspo_ratios():
    PolicyLossConfig.model_validate(
        {
            "use_cispo": True,
            "use_importance_sampling_correction": True,
            "sequence_level_importance_ratios": True,
            "token_level_loss": False,
        }
    )
