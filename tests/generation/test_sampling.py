"""sample_next_tokens: frequencies match the sampled distribution, logprobs are exact and unbiased."""

import math

import pytest
import torch

from asyncppo.generation.protocol import SamplingParams
from asyncppo.generation.sampling import SamplingSettings, filter_logits, sample_next_tokens


def settings_for(num_rows: int, **params: float | int | bool) -> SamplingSettings:
    return SamplingSettings.from_params([SamplingParams(**params)] * num_rows, "cpu")  # pyright: ignore[reportArgumentType]


def chi_squared_p_value(counts: torch.Tensor, probs: torch.Tensor) -> float:
    """Pearson's test of observed counts against expected probabilities over the support of `probs`."""
    support = probs > 0
    expected = probs[support].double() * counts.sum()
    statistic = ((counts[support].double() - expected) ** 2 / expected).sum()
    degrees_of_freedom = int(support.sum()) - 1
    # Survival function of chi2(df) at x is the regularised upper incomplete gamma Q(df / 2, x / 2).
    return float(torch.special.gammaincc(torch.tensor(degrees_of_freedom / 2), statistic / 2))


# Probabilities 1/2, 1/4, 1/8, 1/8 make the filtered distributions easy to derive by hand.
DYADIC_LOGITS = torch.tensor([[0.5, 0.25, 0.125, 0.125]]).log()


@pytest.mark.parametrize("temperature", [1.0, 0.7, 1.5])
def test_sampled_frequencies_match_the_tempered_softmax(temperature: float) -> None:
    num_draws = 40_000
    logits = torch.tensor([2.0, 1.0, 0.5, 0.0, -0.5, -1.0, -3.0, 0.2])
    generator = torch.Generator().manual_seed(1)
    settings = settings_for(num_draws, temperature=temperature)
    tokens, _ = sample_next_tokens(logits.expand(num_draws, -1), settings, generator)
    counts = torch.bincount(tokens, minlength=8)
    assert chi_squared_p_value(counts, torch.softmax(logits / temperature, dim=-1)) > 1e-3


def test_sampled_frequencies_match_the_renormalised_filtered_distribution() -> None:
    num_draws = 40_000
    logits = torch.tensor([2.0, 1.0, 0.5, 0.0, -0.5, -1.0, -3.0, 0.2])
    generator = torch.Generator().manual_seed(2)
    settings = settings_for(num_draws, temperature=0.8, top_k=5, top_p=0.9)
    tokens, logprobs = sample_next_tokens(logits.expand(num_draws, -1), settings, generator)
    expected = torch.softmax(filter_logits(logits.unsqueeze(0) / 0.8, settings.top_k[:1], settings.top_p[:1]), -1)[0]
    counts = torch.bincount(tokens, minlength=8)
    assert torch.all(counts[expected == 0] == 0)
    assert 2 <= int((expected > 0).sum()) < 8  # the filters really removed tokens
    assert chi_squared_p_value(counts, expected) > 1e-3
    torch.testing.assert_close(logprobs, expected.log()[tokens], rtol=0, atol=1e-6)


def test_mean_sampled_logprob_equals_minus_the_entropy_without_bias() -> None:
    # E_q[log q(token)] = -H(q); a biased sampler (one compiled sampler was measured 0.011-0.017 nats off) fails
    # this z-test.
    num_draws, vocab_size = 20_000, 300
    logits = torch.randn(vocab_size, generator=torch.Generator().manual_seed(3)) * 2
    _, logprobs = sample_next_tokens(
        logits.expand(num_draws, -1), settings_for(num_draws), torch.Generator().manual_seed(4)
    )
    log_q = torch.log_softmax(logits, dim=-1).double()
    entropy = -(log_q.exp() * log_q).sum()
    standard_error = float(((log_q.exp() * (log_q + entropy) ** 2).sum() / num_draws).sqrt())
    z = (float(logprobs.double().mean()) + float(entropy)) / standard_error
    assert abs(z) < 4, f"mean sampled logprob is {z:.1f} standard errors away from -entropy"


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_logprobs_without_filters_equal_log_softmax_of_tempered_logits_exactly(dtype: torch.dtype) -> None:
    logits = (torch.randn(6, 300, generator=torch.Generator().manual_seed(5)) * 4).to(dtype)
    temperatures = [1.0, 0.7, 1.3, 0.7, 0.25, 1.0]
    settings = SamplingSettings.from_params([SamplingParams(temperature=t) for t in temperatures], "cpu")
    tokens, logprobs = sample_next_tokens(logits, settings, torch.Generator().manual_seed(6))
    assert logprobs.dtype == torch.float32
    for row, temperature in enumerate(temperatures):
        # Exactly what models.policy.token_logprobs computes: fp32 logits divided by a Python float.
        reference = torch.log_softmax(logits[row : row + 1].float() / temperature, dim=-1)[0, tokens[row]]
        assert logprobs[row].item() == reference.item()


@pytest.mark.parametrize(
    ("top_k", "top_p", "expected_probs"),
    [
        (2, 1.0, [2 / 3, 1 / 3, 0, 0]),  # top-2 of (1/2, 1/4, 1/8, 1/8), renormalised by 3/4
        (3, 1.0, [0.5, 0.25, 0.125, 0.125]),  # the 3rd logit ties the 4th: both stay
        (0, 0.6, [2 / 3, 1 / 3, 0, 0]),  # mass before token 1 is 0.5 < 0.6, before token 2 is 0.75
        (0, 0.5, [1.0, 0, 0, 0]),  # mass before token 1 is 0.5, not < 0.5
        (2, 0.9, [2 / 3, 1 / 3, 0, 0]),  # top-p on the top-k distribution: mass before token 1 is 2/3 < 0.9
        (2, 0.6, [1.0, 0, 0, 0]),  # ... and 2/3 >= 0.6 drops it
        (0, 1.0, [0.5, 0.25, 0.125, 0.125]),  # filters off
    ],
)
def test_filters_renormalise_over_the_kept_tokens(top_k: int, top_p: float, expected_probs: list[float]) -> None:
    settings = settings_for(1, top_k=top_k, top_p=top_p)
    filtered = filter_logits(DYADIC_LOGITS, settings.top_k, settings.top_p)
    torch.testing.assert_close(torch.softmax(filtered, dim=-1)[0], torch.tensor(expected_probs), rtol=0, atol=1e-6)
    batch_settings = settings_for(64, top_k=top_k, top_p=top_p)
    tokens, logprobs = sample_next_tokens(
        DYADIC_LOGITS.expand(64, -1), batch_settings, torch.Generator().manual_seed(7)
    )
    torch.testing.assert_close(logprobs.exp(), torch.tensor(expected_probs)[tokens], rtol=0, atol=1e-6)


def test_top_k_larger_than_the_vocabulary_keeps_everything() -> None:
    settings = settings_for(1, top_k=100)
    assert torch.equal(filter_logits(DYADIC_LOGITS, settings.top_k, settings.top_p), DYADIC_LOGITS)


def test_greedy_takes_the_argmax_with_its_temperature_one_logprob() -> None:
    logits = torch.tensor([[0.1, 3.0, 2.9, -1.0], [5.0, 0.0, 0.0, 4.0]])
    params = [SamplingParams(greedy=True, temperature=0.3, top_k=1), SamplingParams(greedy=True)]
    tokens, logprobs = sample_next_tokens(logits, SamplingSettings.from_params(params, "cpu"), None)
    assert tokens.tolist() == [1, 0]
    expected = torch.log_softmax(logits, dim=-1)[torch.arange(2), tokens]
    assert torch.equal(logprobs, expected)


def test_rows_with_different_settings_are_sampled_independently_in_one_batch() -> None:
    logits = DYADIC_LOGITS.expand(3, -1)
    params = [SamplingParams(top_k=1), SamplingParams(greedy=True), SamplingParams(top_p=0.5)]
    tokens, logprobs = sample_next_tokens(logits, SamplingSettings.from_params(params, "cpu"), None)
    assert tokens.tolist() == [0, 0, 0]
    torch.testing.assert_close(logprobs, torch.tensor([0.0, math.log(0.5), 0.0]))


def test_the_same_generator_seed_gives_the_same_tokens() -> None:
    logits = torch.randn(16, 50, generator=torch.Generator().manual_seed(8))
    first, _ = sample_next_tokens(logits, settings_for(16), torch.Generator().manual_seed(9))
    second, _ = sample_next_tokens(logits, settings_for(16), torch.Generator().manual_seed(9))
    third, _ = sample_next_tokens(logits, settings_for(16), torch.Generator().manual_seed(10))
    assert torch.equal(first, second) and not torch.equal(first, third)
