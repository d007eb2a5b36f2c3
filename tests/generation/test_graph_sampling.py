"""graph_sampling: the counter-based hash is splitmix64, its uniforms are sound, and sample_tokens keeps the hf
sampler's semantics (frequencies, exact logprobs, greedy) while each row depends only on its own seed and position.
"""

import math

import pytest
import torch

from asyncppo.generation.graph_sampling import (
    counter_uniforms,
    filter_all_rows,
    filtered_log_softmax,
    mix64,
    sample_tokens,
    uniforms_from_bits,
)
from asyncppo.generation.sampling import filter_logits

UINT64_MASK = (1 << 64) - 1
GOLDEN_GAMMA = 0x9E3779B97F4A7C15

# Deliberately uneven probabilities (0.49 down to 0.003), so a wrong temperature or filter shows in the counts.
SMALL_LOGITS = torch.tensor([2.0, 1.0, 0.5, 0.0, -0.5, -1.0, -3.0, 0.2])


def as_int64(value: int) -> int:
    """The int64 with the same 64 bits as an unsigned value."""
    value &= UINT64_MASK
    return value - (1 << 64) if value >= 1 << 63 else value


def reference_mix64(value: int) -> int:
    """splitmix64's finaliser on Python ints (unbounded, so shifts are logical and products are reduced by hand)."""
    z = value & UINT64_MASK
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & UINT64_MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & UINT64_MASK
    return as_int64(z ^ (z >> 31))


def row_settings(
    num_rows: int,
    *,
    temperature: float = 1.0,
    top_p: float = 1.0,
    top_k: int = 0,
    greedy: bool = False,
) -> dict[str, torch.Tensor]:
    """The per-row setting tensors of sample_tokens, one value for all rows."""
    return {
        "temperature": torch.full((num_rows,), temperature),
        "top_p": torch.full((num_rows,), top_p),
        "top_k": torch.full((num_rows,), top_k, dtype=torch.long),
        "greedy": torch.full((num_rows,), greedy),
    }


def chi_squared_p_value(counts: torch.Tensor, probs: torch.Tensor) -> float:
    """Pearson's test of observed counts against expected probabilities over the support of `probs`."""
    support = probs > 0
    expected = probs[support].double() * counts.sum()
    statistic = ((counts[support].double() - expected) ** 2 / expected).sum()
    # The chi2(df) survival function at x is the regularised upper incomplete gamma Q(df / 2, x / 2).
    return float(torch.special.gammaincc(torch.tensor((int(support.sum()) - 1) / 2), statistic / 2))


def test_mix64_matches_the_splitmix64_reference_including_the_published_sequence() -> None:
    inputs = [0, 1, -1, 2, 12345, -987654321, 2**62 + 3, 2**63 - 1, -(2**63), as_int64(GOLDEN_GAMMA)]
    mixed = mix64(torch.tensor(inputs, dtype=torch.long))
    assert mixed.tolist() == [reference_mix64(value) for value in inputs]
    # splitmix64 seeded with 1234567 (Vigna's reference generator): output i is mix64(seed + i * gamma), i >= 1.
    stream = mix64(1234567 + torch.arange(1, 6) * as_int64(GOLDEN_GAMMA))
    published = [
        6457827717110365317,
        3203168211198807973,
        9817491932198370423,
        4593380528125082431,
        16408922859458223821,
    ]
    assert stream.tolist() == [as_int64(value) for value in published]


def test_uniforms_from_bits_are_exact_half_offset_grid_points_strictly_inside_zero_one() -> None:
    # All-zero and all-one top bits: 2**-53 and 1 - 2**-53, the extremes; neither rounds onto 0 or 1.
    extremes = uniforms_from_bits(torch.tensor([0, -1, 2**63 - 1, -(2**63)], dtype=torch.long))
    assert extremes.dtype == torch.float64
    assert extremes.tolist() == [2.0**-53, 1 - 2.0**-53, 0.5 - 2.0**-53, 0.5 + 2.0**-53]
    bits = torch.randint(-(2**63), 2**63 - 1, (1000,), generator=torch.Generator().manual_seed(0))
    expected = [(((value & UINT64_MASK) >> 12) + 0.5) * 2.0**-52 for value in bits.tolist()]
    assert uniforms_from_bits(bits).tolist() == expected


def test_counter_uniforms_follow_the_documented_formula_exactly() -> None:
    # key = mix64(mix64(seed + G) + position * G), u[v] = ((mix64((key + v) * G) >>> 12) + 0.5) * 2**-52.
    seeds, positions = [0, 7, -(2**63), 2**63 - 1], [0, 123456, 5, -1]
    uniforms = counter_uniforms(torch.tensor(seeds), torch.tensor(positions), 5)
    for row, (seed, position) in enumerate(zip(seeds, positions, strict=True)):
        key = reference_mix64(reference_mix64(seed + GOLDEN_GAMMA) + position * GOLDEN_GAMMA)
        for token in range(5):
            bits = reference_mix64((key + token) * GOLDEN_GAMMA) & UINT64_MASK
            assert uniforms[row, token].item() == ((bits >> 12) + 0.5) * 2.0**-52


def test_counter_uniforms_lie_strictly_inside_zero_one_and_spread_evenly() -> None:
    num_rows, vocab_size = 256, 4096
    seeds = torch.cat([torch.tensor([-(2**63), -1, 0, 2**63 - 1]), torch.arange(num_rows - 4)])
    positions = torch.cat([torch.tensor([2**63 - 1, 0, -(2**63), 1]), torch.arange(num_rows - 4) * 1000])
    uniforms = counter_uniforms(seeds, positions, vocab_size)
    assert uniforms.shape == (num_rows, vocab_size) and uniforms.dtype == torch.float64
    assert float(uniforms.min()) > 0 and float(uniforms.max()) < 1
    # Mean of n uniforms: 0.5 with standard deviation sqrt(1 / (12 n)).
    assert abs(float(uniforms.mean()) - 0.5) < 4 * math.sqrt(1 / (12 * uniforms.numel()))
    num_buckets = 64
    counts = torch.bincount((uniforms * num_buckets).long().flatten(), minlength=num_buckets)
    assert chi_squared_p_value(counts, torch.full((num_buckets,), 1 / num_buckets)) > 1e-3


@pytest.mark.parametrize("neighbour", ["next seed", "next position", "next token"])
def test_uniforms_of_adjacent_seeds_positions_and_tokens_are_uncorrelated(neighbour: str) -> None:
    num_rows, vocab_size = 256, 4097
    seeds, positions = torch.arange(num_rows) * 3, torch.arange(num_rows) % 7
    uniforms = counter_uniforms(seeds, positions, vocab_size)
    if neighbour == "next seed":
        first, second = uniforms[:, :-1], counter_uniforms(seeds + 1, positions, vocab_size)[:, :-1]
    elif neighbour == "next position":
        first, second = uniforms[:, :-1], counter_uniforms(seeds, positions + 1, vocab_size)[:, :-1]
    else:
        first, second = uniforms[:, :-1], uniforms[:, 1:]
    assert not torch.any(first == second)
    first, second = first.flatten() - 0.5, second.flatten() - 0.5
    correlation = float((first * second).sum() / (first.square().sum() * second.square().sum()).sqrt())
    # Independent pairs: the sample correlation has standard deviation 1 / sqrt(n), here about 1 / 1024.
    assert abs(correlation) < 5 / math.sqrt(first.numel())


def test_a_rows_uniforms_depend_only_on_its_seed_position_and_token_id() -> None:
    seeds, positions = torch.tensor([5, -3, 5, 9]), torch.tensor([0, 0, 1, 2])
    batch = counter_uniforms(seeds, positions, 100)
    for row in range(4):
        alone = counter_uniforms(seeds[row : row + 1], positions[row : row + 1], 100)
        assert torch.equal(batch[row], alone[0])
    # Token v's noise does not depend on the vocabulary size either.
    assert torch.equal(counter_uniforms(seeds, positions, 10), batch[:, :10])
    assert not torch.equal(batch[0], batch[2])  # same seed, next position


def test_counter_uniforms_reject_narrower_integer_seeds() -> None:
    with pytest.raises(TypeError, match="int64"):
        counter_uniforms(torch.tensor([1], dtype=torch.int32), torch.tensor([0]), 8)


@pytest.mark.parametrize(
    ("temperature", "top_p", "top_k", "filtered"),
    [(0.7, 1.0, 0, False), (1.0, 0.8, 0, True), (1.0, 1.0, 3, True), (1.3, 0.9, 6, True)],
    ids=["temperature", "top_p", "top_k", "top_k+top_p+temperature"],
)
def test_sampled_frequencies_match_the_filtered_tempered_softmax(
    temperature: float, top_p: float, top_k: int, filtered: bool
) -> None:
    num_draws = 240_000
    # Draws differ by seed and by position: 15,000 seeds, 16 consecutive positions each.
    seeds, positions = torch.arange(num_draws) // 16 + 1000, torch.arange(num_draws) % 16
    settings = row_settings(num_draws, temperature=temperature, top_p=top_p, top_k=top_k)
    logits = SMALL_LOGITS.expand(num_draws, -1)
    tokens, logprobs = sample_tokens(logits, **settings, seeds=seeds, positions=positions, filtered=filtered)

    # The hf sampler's filter gives the distribution to match (its own tests pin it against hand-derived values).
    one_row = {name: value[:1] for name, value in settings.items()}
    expected = torch.softmax(filter_logits(SMALL_LOGITS[None] / temperature, one_row["top_k"], one_row["top_p"]), -1)[0]
    support_size = int((expected > 0).sum())
    # The filters really removed tokens (8 kept without a filter), top-p beyond top-k when both are set.
    assert support_size == 8 if top_k == 0 and top_p == 1 else support_size < 8
    if top_k and top_p < 1:
        assert support_size < top_k
    counts = torch.bincount(tokens, minlength=8)
    assert torch.all(counts[expected == 0] == 0)
    assert chi_squared_p_value(counts, expected) > 1e-3
    torch.testing.assert_close(logprobs, expected.log()[tokens], rtol=0, atol=1e-6)


def test_sampled_token_is_the_exponential_race_winner_over_the_counter_uniforms() -> None:
    num_rows, vocab_size = 64, 1000
    logits = torch.randn(num_rows, vocab_size, generator=torch.Generator().manual_seed(4))
    seeds, positions = torch.arange(num_rows) - 30, torch.arange(num_rows) * 17
    tokens, _ = sample_tokens(logits, **row_settings(num_rows), seeds=seeds, positions=positions, filtered=False)
    exponentials = -counter_uniforms(seeds, positions, vocab_size).log()
    expected = (torch.log_softmax(logits, -1).double() - exponentials.log()).argmax(-1)
    assert torch.equal(tokens, expected)
    assert not torch.equal(tokens, logits.argmax(-1))  # the noise decided some tokens


@pytest.mark.parametrize("filtered", [False, True])
def test_greedy_rows_take_the_argmax_with_its_temperature_one_logprob(filtered: bool) -> None:
    num_rows = 200
    # Two near-equal leaders: the second is sampled often at temperature 2, never by a greedy row.
    logits = torch.tensor([0.1, 3.0, 2.9, -1.0]).expand(num_rows, -1)
    greedy = torch.arange(num_rows) % 2 == 0
    settings = row_settings(num_rows, temperature=2.0, top_p=0.5 if filtered else 1.0, top_k=2 if filtered else 0)
    settings["greedy"] = greedy
    seeds, positions = torch.arange(num_rows), torch.zeros(num_rows, dtype=torch.long)
    tokens, logprobs = sample_tokens(logits, **settings, seeds=seeds, positions=positions, filtered=filtered)
    assert torch.all(tokens[greedy] == 1)
    assert torch.all(logprobs[greedy] == torch.log_softmax(logits[0], -1)[1])
    if not filtered:  # (top_p = 0.5 would leave the sampling rows only token 1 as well)
        assert torch.any(tokens[~greedy] != 1)


def test_mean_sampled_logprob_equals_minus_the_entropy_on_a_full_size_vocabulary() -> None:
    # E_q[log q(token)] = -H(q); a sampler biased on the many tail tokens of a real vocabulary fails this z-test.
    num_draws, chunk_rows, vocab_size = 2000, 8, 150_000
    logits = torch.randn(vocab_size, generator=torch.Generator().manual_seed(3)) * 2
    sampled_logprobs = []
    for start in range(0, num_draws, chunk_rows):
        settings = row_settings(chunk_rows)
        seeds, positions = torch.arange(start, start + chunk_rows), torch.full((chunk_rows,), 11)
        _, logprobs = sample_tokens(
            logits.expand(chunk_rows, -1), **settings, seeds=seeds, positions=positions, filtered=False
        )
        sampled_logprobs.append(logprobs)
    log_q = torch.log_softmax(logits.double(), dim=-1)
    entropy = -(log_q.exp() * log_q).sum()
    standard_error = float(((log_q.exp() * (log_q + entropy) ** 2).sum() / num_draws).sqrt())
    z = (float(torch.cat(sampled_logprobs).double().mean()) + float(entropy)) / standard_error
    assert abs(z) < 3, f"mean sampled logprob is {z:.1f} standard errors away from -entropy"


@pytest.mark.parametrize("filtered", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_logprobs_without_filters_equal_the_trainers_formula(dtype: torch.dtype, filtered: bool) -> None:
    logits = (torch.randn(6, 300, generator=torch.Generator().manual_seed(5)) * 4).to(dtype)
    temperatures = [1.0, 0.7, 1.3, 0.7, 0.25, 1.0]
    settings = row_settings(6)
    settings["temperature"] = torch.tensor(temperatures)
    tokens, logprobs = sample_tokens(
        logits, **settings, seeds=torch.arange(6), positions=torch.arange(6), filtered=filtered
    )
    assert tokens.dtype == torch.long and logprobs.dtype == torch.float32
    for row, temperature in enumerate(temperatures):
        # What the trainer computes: fp32 logits divided by a Python float, the target's logit minus logsumexp.
        # The sampler reduces in another order (and the filtered path through log_softmax): equal to rounding.
        scaled = logits[row].float() / temperature
        reference = scaled[tokens[row]] - torch.logsumexp(scaled, dim=-1)
        assert logprobs[row].item() == pytest.approx(reference.item(), abs=2e-6)


@pytest.mark.parametrize("filtered", [False, True])
def test_a_row_samples_the_same_token_alone_and_inside_a_batch_of_other_requests(filtered: bool) -> None:
    vocab_size, num_others = 1000, 7
    generator = torch.Generator().manual_seed(8)
    row_logits = torch.randn(1, vocab_size, generator=generator) * 0.5  # flat: the token depends on the noise
    other_logits = torch.randn(num_others, vocab_size, generator=generator) * 3
    others = {
        "temperature": torch.rand(num_others, generator=generator) + 0.5,
        "top_p": torch.tensor([1.0, 0.9, 0.5, 1.0, 0.7, 1.0, 0.95]) if filtered else torch.ones(num_others),
        "top_k": torch.tensor([0, 50, 0, 5, 0, 1, 20]) if filtered else torch.zeros(num_others, dtype=torch.long),
        "greedy": torch.tensor([False, False, True, False, False, False, True]),
    }
    row = {"temperature": torch.tensor([0.9]), "top_p": torch.tensor([1.0]), "top_k": torch.tensor([0])}
    row["greedy"] = torch.tensor([False])
    alone_tokens = []
    for seed in range(20):
        alone = sample_tokens(
            row_logits, **row, seeds=torch.tensor([seed]), positions=torch.tensor([3]), filtered=filtered
        )
        # The row sits at index 4 of the batch; the other rows have other seeds, positions and settings.
        batch = {name: torch.cat([others[name][:4], row[name], others[name][4:]]) for name in row}
        batch_logits = torch.cat([other_logits[:4], row_logits, other_logits[4:]])
        seeds = torch.tensor([seed + 100, seed + 1, -seed, 7, seed, 2**40, 5, seed * 3 + 1])
        positions = torch.tensor([3, 4, 0, 9, 3, 3, 1, 2])
        together = sample_tokens(batch_logits, **batch, seeds=seeds, positions=positions, filtered=filtered)
        assert together[0][4] == alone[0][0] and together[1][4] == alone[1][0]
        alone_tokens.append(int(alone[0][0]))
    assert len(set(alone_tokens)) > 10  # the noise, not the logits, picked these tokens


def test_same_seed_and_position_repeat_the_tokens_and_another_seed_or_position_changes_them() -> None:
    num_rows, vocab_size = 64, 1000
    logits = torch.zeros(num_rows, vocab_size)  # uniform q: every token is the noise's choice
    settings = row_settings(num_rows)
    seeds, positions = torch.arange(num_rows) + 77, torch.full((num_rows,), 5)

    def draw(seeds: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        return sample_tokens(logits, **settings, seeds=seeds, positions=positions, filtered=False)[0]

    first = draw(seeds, positions)
    assert torch.equal(draw(seeds, positions), first)
    # Under independent noise two draws agree with probability 1 / V per row.
    assert int((draw(seeds, positions + 1) == first).sum()) <= 3
    assert int((draw(seeds + num_rows, positions) == first).sum()) <= 3


def test_filtered_and_unfiltered_paths_agree_on_rows_without_filters() -> None:
    num_rows, vocab_size = 16, 500
    logits = (torch.randn(num_rows, vocab_size, generator=torch.Generator().manual_seed(9)) * 3).bfloat16()
    settings = row_settings(num_rows)
    settings["temperature"] = torch.linspace(0.3, 1.7, num_rows)
    settings["greedy"] = torch.arange(num_rows) % 5 == 0
    seeds, positions = torch.arange(num_rows) * 1_000_003, torch.arange(num_rows) + 40
    unfiltered = sample_tokens(logits, **settings, seeds=seeds, positions=positions, filtered=False)
    filtered = sample_tokens(logits, **settings, seeds=seeds, positions=positions, filtered=True)
    # The same tokens; the logprobs agree to rounding (x - logsumexp(x) against log_softmax(x)).
    assert torch.equal(unfiltered[0], filtered[0])
    torch.testing.assert_close(unfiltered[1], filtered[1], rtol=0, atol=2e-6)


# Probabilities 1/2, 1/4, 1/8, 1/8: the 3rd and 4th logits tie, and the top-p boundaries fall on exact masses.
DYADIC_LOGITS = torch.tensor([0.5, 0.25, 0.125, 0.125]).log()


def test_filter_all_rows_equals_the_hf_sampler_filter_on_every_row() -> None:
    settings = [(2, 1.0), (3, 1.0), (0, 0.6), (0, 0.5), (2, 0.9), (2, 0.6), (0, 1.0), (100, 1.0), (1, 0.3)]
    dyadic = DYADIC_LOGITS.expand(len(settings), -1)
    random = torch.randn(len(settings), 4, generator=torch.Generator().manual_seed(10))
    logits = torch.cat([dyadic, random])
    top_k = torch.tensor([k for k, _ in settings] * 2)
    top_p = torch.tensor([p for _, p in settings] * 2)
    assert torch.equal(filter_all_rows(logits, top_k, top_p), filter_logits(logits, top_k, top_p))


def test_the_filtered_log_softmax_custom_op_has_a_schema_and_fake_kernel_that_torch_compile_can_trace() -> None:
    # sample_tokens relies on it being opaque to torch.compile; a wrong fake kernel only shows there.
    logits, temperature = torch.randn(3, 50).bfloat16(), torch.tensor([1.0, 0.5, 2.0])
    top_k, top_p = torch.tensor([0, 5, 60]), torch.tensor([1.0, 0.9, 0.5])
    # opcheck raises if a schema, fake kernel or dynamic-shape trace disagrees with the real kernel.
    torch.library.opcheck(filtered_log_softmax, (logits, temperature, top_k, top_p))
