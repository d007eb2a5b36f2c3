"""Train/inference mismatch diagnostics: token metrics, per-sequence errors and masking, plot data."""

import math

import pytest
import torch

from asyncppo.algorithms.mismatch import (
    approx_entropy,
    mask_sequences_by_logprob_error,
    mismatch_plot_data,
    sequence_mult_prob_errors,
    token_mismatch_metrics,
)

LN2 = math.log(2.0)
NAN = math.nan


def test_token_metrics_on_a_hand_example():
    # Two tokens: old = [0, 0], gen = [log 0.5, 0] -> d = old - gen = [ln 2, 0]. A third, masked token holds NaN.
    #   token_mult_prob_error = (e^{ln 2} + e^0) / 2 = 1.5
    #   gen_kl_error    (k3, log-ratio  d) = ((2 - 1 - ln 2) + 0) / 2 = (1 - ln 2) / 2
    #   policy_kl_error (k3, log-ratio -d) = ((0.5 - 1 + ln 2) + 0) / 2
    #   js: M = log(0.5 * 1 + 0.5 * 0.5) = log 0.75 on token 0 (token 1: M = 0, both terms 0)
    #       k3(old vs M): lr = log 0.75 - 0     -> 0.75 - 1 - log 0.75
    #       k3(gen vs M): lr = log 0.75 - log .5 = log 1.5 -> 1.5 - 1 - log 1.5
    #       js = 0.5 (both) / 2 tokens
    old = torch.tensor([[0.0, 0.0, NAN]])
    gen = torch.tensor([[math.log(0.5), 0.0, NAN]])
    mask = torch.tensor([[1.0, 1.0, 0.0]])
    metrics = token_mismatch_metrics(old, gen, mask, 2.0, "k3")
    js_token = 0.5 * (0.75 - 1 - math.log(0.75)) + 0.5 * (1.5 - 1 - math.log(1.5))
    assert metrics == pytest.approx(
        {
            "token_mult_prob_error": 1.5,
            "gen_kl_error": (1 - LN2) / 2,
            "policy_kl_error": (0.5 - 1 + LN2) / 2,
            "js_divergence_error": js_token / 2,
        }
    )
    # k1 on pi_gen samples: log gen - log train = -ln 2 on token 0. Dividing by a global count of 4 halves all.
    k1 = token_mismatch_metrics(old, gen, mask, 4.0, "k1")
    assert k1["gen_kl_error"] == pytest.approx(-LN2 / 4)
    assert k1["token_mult_prob_error"] == pytest.approx(0.75)


def test_approx_entropy_is_minus_mean_logprob_on_policy():
    # curr = gen = [log .5, log .25] -> -mean(curr) = 1.5 ln 2; weight exp(curr - gen) = 1.
    curr = torch.tensor([[math.log(0.5), math.log(0.25)]])
    assert approx_entropy(curr, curr, torch.ones(1, 2), 2.0).item() == pytest.approx(1.5 * LN2)
    # Off-policy: gen = curr - ln 2 on token 0 -> weight 2: -(2 log .5 + log .25) / 2 = 2 ln 2.
    gen = curr - torch.tensor([[LN2, 0.0]])
    assert approx_entropy(curr, gen, torch.ones(1, 2), 2.0).item() == pytest.approx(2 * LN2)


# Sequence 0: d = [ln 2, 0] -> e = (2 + 1) / 2 = 1.5. Sequence 1: d = [ln 3] (+ a masked NaN) -> e = 3.
# Sequence 2: no valid token (excluded from the statistics, keeps its sample_mask). Sequence 3: e = 1, weight 0.5.
SEQ_OLD = torch.tensor([[0.0, 0.0], [0.0, NAN], [0.0, 0.0], [0.0, 0.0]])
SEQ_GEN = torch.tensor([[LN2, 0.0], [-math.log(3.0), 0.0], [5.0, 5.0], [0.0, 0.0]])
SEQ_MASK = torch.tensor([[1.0, 1.0], [1.0, 0.0], [0.0, 0.0], [1.0, 1.0]])


def test_sequence_errors_average_exp_abs_gap_over_valid_tokens():
    errors, has_tokens = sequence_mult_prob_errors(SEQ_OLD, SEQ_GEN, SEQ_MASK)
    torch.testing.assert_close(errors, torch.tensor([1.5, 3.0, 0.0, 1.0]))
    assert has_tokens.tolist() == [True, True, False, True]


def test_masking_drops_sequences_above_threshold_into_a_new_sample_mask():
    sample_mask = torch.tensor([1.0, 1.0, 1.0, 0.5])
    rewards = torch.tensor([0.0, 1.0, 1.0, 1.0])
    new_mask, metrics = mask_sequences_by_logprob_error(
        2.0,
        old_logprobs=SEQ_OLD,
        generation_logprobs=SEQ_GEN,
        token_mask=SEQ_MASK,
        sample_mask=sample_mask,
        rewards=rewards,
    )
    torch.testing.assert_close(new_mask, torch.tensor([1.0, 0.0, 1.0, 0.5]))
    torch.testing.assert_close(sample_mask, torch.tensor([1.0, 1.0, 1.0, 0.5]))  # input untouched
    assert metrics == pytest.approx(
        {
            "max_seq_mult_prob_error": 3.0,
            "mean_seq_mult_prob_error": (1.5 + 3.0 + 1.0) / 3,
            "min_seq_mult_prob_error": 1.0,
            "num_masked_seqs_by_logprob_error": 1.0,
            "masked_correct_pct": 1.0,  # the one masked sequence has reward 1
            "max_seq_mult_prob_error_after_mask": 1.5,
            "mean_seq_mult_prob_error_after_mask": 1.25,
            "min_seq_mult_prob_error_after_mask": 1.0,
        }
    )


def test_already_dropped_sequences_neither_feed_statistics_nor_count_as_masked():
    new_mask, metrics = mask_sequences_by_logprob_error(
        2.0,
        old_logprobs=SEQ_OLD,
        generation_logprobs=SEQ_GEN,
        token_mask=SEQ_MASK,
        sample_mask=torch.tensor([1.0, 0.0, 1.0, 1.0]),
        rewards=torch.zeros(4),
    )
    torch.testing.assert_close(new_mask, torch.tensor([1.0, 0.0, 1.0, 1.0]))
    assert metrics["num_masked_seqs_by_logprob_error"] == 0.0
    assert metrics["masked_correct_pct"] == 0.0
    assert metrics["max_seq_mult_prob_error"] == pytest.approx(1.5)


def test_no_threshold_only_reports_statistics():
    sample_mask = torch.ones(4)
    new_mask, metrics = mask_sequences_by_logprob_error(
        None,
        old_logprobs=SEQ_OLD,
        generation_logprobs=SEQ_GEN,
        token_mask=SEQ_MASK,
        sample_mask=sample_mask,
        rewards=torch.zeros(4),
    )
    assert new_mask is not sample_mask
    torch.testing.assert_close(new_mask, sample_mask)
    assert set(metrics) == {"max_seq_mult_prob_error", "mean_seq_mult_prob_error", "min_seq_mult_prob_error"}
    with pytest.raises(ValueError, match="threshold"):
        mask_sequences_by_logprob_error(
            0.0,
            old_logprobs=SEQ_OLD,
            generation_logprobs=SEQ_GEN,
            token_mask=SEQ_MASK,
            sample_mask=sample_mask,
            rewards=torch.zeros(4),
        )


def test_plot_data_follows_the_worst_sequence():
    # Sequence 0: policy tokens at 1, 2 with no gap -> e = 1.
    # Sequence 1: policy tokens at 2, 3, 5 (4 is tool output; gen holds NaN there):
    #   pos 2: p_gen .5, p_train .25 -> |diff| = ln 2,  rel = .25/.5 = 0.5
    #   pos 3: p_gen .1, p_train .3  -> |diff| = ln 3,  rel = .2/.1  = 2.0   <- max relative error
    #   pos 5: p_gen .9, p_train .09 -> |diff| = ln 10, rel = .81/.9 = 0.9   <- max absolute error
    #   e = (2 + 3 + 10) / 3 = 5 -> the worst sequence.
    log = math.log
    old = torch.tensor([[0.0, -1.0, -2.0, 0.0, 0.0, 0.0], [0.0, 0.0, log(0.25), log(0.3), -7.0, log(0.09)]])
    gen = torch.tensor([[0.0, -1.0, -2.0, 0.0, 0.0, 0.0], [0.0, 0.0, log(0.5), log(0.1), NAN, log(0.9)]])
    token_mask = torch.tensor([[0.0, 1, 1, 0, 0, 0], [0.0, 0, 1, 1, 0, 1]])
    data = mismatch_plot_data(old, gen, token_mask)
    assert data is not None
    assert data.sample_index == 1
    assert data.seq_mult_prob_error == pytest.approx(5.0)
    assert data.positions == [2, 3, 4, 5]
    assert data.generation_logprobs == pytest.approx([log(0.5), log(0.1), 0.0, log(0.9)])
    assert data.training_logprobs == pytest.approx([log(0.25), log(0.3), 0.0, log(0.09)])
    assert data.abs_diff == pytest.approx([LN2, log(3.0), 0.0, log(10.0)])
    assert data.max_abs_error_position == 5
    assert data.max_rel_error_position == 3


def test_plot_data_is_none_when_the_generated_span_is_empty():
    assert mismatch_plot_data(torch.zeros(2, 3), torch.zeros(2, 3), torch.zeros(2, 3)) is None
