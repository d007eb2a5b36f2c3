"""turn_gae: span construction and validation, the turn TD recursion by hand, scatter / gather, turn rewards,
turn metrics, and the vectorised turn GAE against a slow pure-Python reference on random message logs."""

import random

import pytest
import torch

from asyncppo.algorithms.gae import gae_recursion
from asyncppo.algorithms.turns import (
    TurnSpans,
    build_turn_spans,
    gather_turn_values,
    scatter_turns_to_anchors,
    scatter_turns_to_tokens,
    turn_gae,
    turn_metrics,
    turn_rewards,
    validate_turn_spans,
)

# user(2) assistant(3) tool(2) assistant(1) assistant(2) -> anchors 2, 7, 8; seq_len 12 leaves 2 padding tokens.
LOG = [("user", 2), ("assistant", 3), ("tool", 2), ("assistant", 1), ("assistant", 2)]


def _token_mask(spans: TurnSpans) -> torch.Tensor:
    return (spans.turn_index >= 0).float()


def test_spans_locate_every_assistant_message_and_split_consecutive_ones() -> None:
    spans = build_turn_spans([LOG], seq_len=12)
    assert spans.anchor_pos.tolist() == [[2, 7, 8]]
    assert spans.anchor_mask.nonzero()[:, 1].tolist() == [2, 7, 8]
    assert spans.turn_index.tolist() == [[-1, -1, 0, 0, 0, -1, -1, 1, 2, 2, -1, -1]]
    assert spans.num_turns.tolist() == [3]
    assert spans.turn_ntokens.tolist() == [[3, 1, 2]]
    assert spans.turn_valid.tolist() == [[True, True, True]]


def test_ragged_batch_pads_turn_slots_and_marks_them_invalid() -> None:
    spans = build_turn_spans([LOG, [("user", 4), ("assistant", 2)]], seq_len=12)
    assert spans.anchor_pos.tolist() == [[2, 7, 8], [4, 0, 0]]
    assert spans.turn_valid.tolist() == [[True, True, True], [True, False, False]]
    assert spans.turn_ntokens.tolist() == [[3, 1, 2], [2, 0, 0]]
    assert spans.num_turns.tolist() == [3, 1]
    assert spans.turn_index[1].tolist() == [-1] * 4 + [0, 0] + [-1] * 6


def test_empty_assistant_message_is_not_a_turn() -> None:
    spans = build_turn_spans([[("user", 2), ("assistant", 0), ("user", 1), ("assistant", 2)]], seq_len=5)
    assert spans.anchor_pos.tolist() == [[3]]
    assert spans.num_turns.tolist() == [1]


def test_batch_without_turns_still_has_one_slot() -> None:
    spans = build_turn_spans([[("user", 3)], [("assistant", 0), ("user", 1)]], seq_len=4)
    assert spans.anchor_pos.shape == (2, 1)
    assert spans.turn_valid.tolist() == [[False], [False]]
    assert spans.num_turns.tolist() == [0, 0]


def test_assistant_message_at_token_zero_raises() -> None:
    with pytest.raises(ValueError, match="position 0"):
        build_turn_spans([[("assistant", 2), ("user", 1)]], seq_len=4)


def test_log_longer_than_seq_len_raises() -> None:
    with pytest.raises(ValueError, match="10 tokens > seq_len=9"):
        build_turn_spans([LOG], seq_len=9)


def test_negative_token_count_raises() -> None:
    with pytest.raises(ValueError, match="negative"):
        build_turn_spans([[("user", -1)]], seq_len=4)


def test_validate_rejects_an_anchor_outside_the_token_mask() -> None:
    spans = build_turn_spans([LOG], seq_len=12)
    mask = _token_mask(spans)
    mask[0, 7] = 0
    with pytest.raises(ValueError, match="anchor at sample 0 position 7"):
        validate_turn_spans(spans, mask)


def test_validate_rejects_a_response_token_outside_every_turn() -> None:
    spans = build_turn_spans([LOG], seq_len=12)
    mask = _token_mask(spans)
    mask[0, 5] = 1  # a tool token marked as trainable
    with pytest.raises(ValueError, match="position 5 belongs to no assistant turn"):
        validate_turn_spans(spans, mask)


def test_validate_only_reports_unmasked_samples_without_turns() -> None:
    spans = build_turn_spans([LOG, [("user", 3)], [("user", 3)]], seq_len=12)
    mask = _token_mask(spans)
    with pytest.warns(UserWarning, match="1 unmasked samples"):
        metrics = validate_turn_spans(spans, mask, sample_mask=torch.tensor([1.0, 1.0, 0.0]))
    assert metrics == {"turn/num_samples_without_turns": 1.0}


def test_validate_rejects_mismatched_shapes() -> None:
    spans = build_turn_spans([LOG], seq_len=12)
    with pytest.raises(ValueError, match="token_mask"):
        validate_turn_spans(spans, torch.ones(1, 11))


def _single_sample_three_turns(turn_values: list[float]) -> tuple[TurnSpans, torch.Tensor]:
    spans = build_turn_spans([LOG], seq_len=12)
    values = torch.full((1, 12), -5.0, dtype=torch.float64)  # off-anchor values must not matter
    values[0, [2, 7, 8]] = torch.tensor(turn_values, dtype=torch.float64)
    return spans, values


def test_turn_gae_matches_hand_computation() -> None:
    # V = [0.2, 0.5, 0.4], r = [0, 0, 1], gamma = 0.9, lambda = 0.5 (gamma lambda = 0.45), backwards:
    #   k=3: delta = 1 + 0.9 * 0 - 0.4 = 0.6;      A3 = 0.6
    #   k=2: delta = 0 + 0.9 * 0.4 - 0.5 = -0.14;  A2 = -0.14 + 0.45 * 0.6 = 0.13
    #   k=1: delta = 0 + 0.9 * 0.5 - 0.2 = 0.25;   A1 = 0.25 + 0.45 * 0.13 = 0.3085
    # G = A + V = [0.5085, 0.63, 1.0].
    spans, values = _single_sample_three_turns([0.2, 0.5, 0.4])
    result = turn_gae(torch.tensor([1.0]), values, spans, _token_mask(spans), 0.9, 0.5, 0.5)
    expected_a = torch.tensor([[0.3085, 0.13, 0.6]], dtype=torch.float64)
    torch.testing.assert_close(result.turn_advantages, expected_a)
    torch.testing.assert_close(result.turn_returns, torch.tensor([[0.5085, 0.63, 1.0]], dtype=torch.float64))
    # Advantages are constant within each turn and 0 off the turns; returns sit at anchors only.
    expected_tokens = [0, 0, 0.3085, 0.3085, 0.3085, 0, 0, 0.13, 0.6, 0.6, 0, 0]
    torch.testing.assert_close(result.advantages, torch.tensor([expected_tokens], dtype=torch.float64))
    expected_returns = [0, 0, 0.5085, 0, 0, 0, 0, 0.63, 1.0, 0, 0, 0]
    torch.testing.assert_close(result.returns, torch.tensor([expected_returns], dtype=torch.float64))


def test_turn_gae_gamma_lambda_one_gives_reward_as_every_return() -> None:
    # gamma = lambda = 1: A_k = R - V(s_k) (the Monte Carlo baseline), so G_k = R for every turn.
    spans, values = _single_sample_three_turns([0.2, 0.5, 0.4])
    result = turn_gae(torch.tensor([0.7]), values, spans, _token_mask(spans), 1.0, 1.0, 1.0)
    torch.testing.assert_close(result.turn_returns, torch.full((1, 3), 0.7, dtype=torch.float64))
    torch.testing.assert_close(result.turn_advantages, torch.tensor([[0.5, 0.2, 0.3]], dtype=torch.float64))


def test_invalid_turn_slots_do_not_leak() -> None:
    # Two valid turns V = [0.3, 0.7], r = [0, 1]; slot 3 holds 99. gamma = lambda = 1:
    # A2 = 1 - 0.7 = 0.3, A1 = 0 + 0.7 - 0.3 + 0.3 = 0.7; the invalid slot keeps A = 0.
    a = gae_recursion(
        torch.tensor([[0.0, 1.0, 0.0]]), torch.tensor([[0.3, 0.7, 99.0]]), torch.tensor([[True, True, False]]), 1, 1
    )
    torch.testing.assert_close(a, torch.tensor([[0.7, 0.3, 0.0]]))
    # Same through turn_gae, with a 2-turn sample padded to K = 3 next to a 3-turn sample.
    spans = build_turn_spans([LOG, [("user", 1), ("assistant", 2), ("tool", 1), ("assistant", 1)]], seq_len=12)
    values = torch.zeros(2, 12)
    values[1, 0] = 99.0  # anchor_pos of invalid slots is 0
    values[1, [1, 4]] = torch.tensor([0.3, 0.7])
    result = turn_gae(torch.tensor([0.0, 1.0]), values, spans, _token_mask(spans), 1.0, 1.0, 1.0)
    torch.testing.assert_close(result.turn_advantages[1], torch.tensor([0.7, 0.3, 0.0]))


def test_decoupled_turn_lambdas() -> None:
    # V = [0.2, 0.5, 0.4], R = 1, gamma = 0.9. lambda_value = 1: G = discounted R = [0.81, 0.9, 1.0];
    # lambda_policy = 0.5: A = [0.3085, 0.13, 0.6] (hand computation above).
    spans, values = _single_sample_three_turns([0.2, 0.5, 0.4])
    result = turn_gae(torch.tensor([1.0]), values, spans, _token_mask(spans), 0.9, 1.0, 0.5)
    torch.testing.assert_close(result.turn_returns, torch.tensor([[0.81, 0.9, 1.0]], dtype=torch.float64))
    torch.testing.assert_close(result.turn_advantages, torch.tensor([[0.3085, 0.13, 0.6]], dtype=torch.float64))


def test_turn_gae_rejects_out_of_range_settings() -> None:
    spans, values = _single_sample_three_turns([0.2, 0.5, 0.4])
    with pytest.raises(ValueError, match="turn_gae_lambda_policy"):
        turn_gae(torch.tensor([1.0]), values, spans, _token_mask(spans), 1.0, 1.0, 1.5)
    with pytest.raises(ValueError, match="turn_gae_gamma"):
        turn_gae(torch.tensor([1.0]), values, spans, _token_mask(spans), -0.1, 1.0, 1.0)


def test_reward_goes_to_the_last_turn_and_token_penalties_sum_into_their_turn() -> None:
    spans = build_turn_spans([LOG, [("user", 3)]], seq_len=12)
    mask = _token_mask(spans)
    penalty = torch.arange(24, dtype=torch.float32).reshape(2, 12) / 10
    # Turn 1 = tokens 2..4: 0.2 + 0.3 + 0.4 = 0.9; turn 2 = token 7: 0.7; turn 3 = tokens 8, 9: 0.8 + 0.9 = 1.7.
    # Sample 0 gets R = 2 on its last turn: [-0.9, -0.7, 2 - 1.7]. Sample 1 has no turn: nothing, even its R.
    r = turn_rewards(torch.tensor([2.0, 5.0]), spans, mask, penalty)
    torch.testing.assert_close(r, torch.tensor([[-0.9, -0.7, 0.3], [0.0, 0.0, 0.0]]))
    # A masked token of a turn (say a truncated one) contributes no penalty.
    mask[0, 9] = 0
    torch.testing.assert_close(turn_rewards(torch.tensor([2.0, 5.0]), spans, mask, penalty)[0, 2], torch.tensor(1.2))


def test_scatter_and_gather_round_trip() -> None:
    spans = build_turn_spans([LOG, [("user", 4), ("assistant", 2)]], seq_len=12)
    per_turn = torch.tensor([[1.0, 2.0, 3.0], [4.0, 0.0, 0.0]])
    at_anchors = scatter_turns_to_anchors(per_turn, spans)
    assert at_anchors.nonzero().tolist() == [[0, 2], [0, 7], [0, 8], [1, 4]]
    assert torch.equal(gather_turn_values(at_anchors, spans), per_turn)
    on_tokens = scatter_turns_to_tokens(per_turn, spans)
    assert on_tokens[0].tolist() == [0, 0, 1, 1, 1, 0, 0, 2, 3, 3, 0, 0]
    assert torch.equal(gather_turn_values(on_tokens, spans), per_turn)


def test_turn_metrics_by_hand_and_respect_the_sample_mask() -> None:
    spans = build_turn_spans([LOG, [("user", 4), ("assistant", 2)], [("user", 1), ("assistant", 5)]], seq_len=12)
    turn_values = torch.tensor([[0.2, 0.5, 0.4], [1.0, 0.0, 0.0], [100.0, 0.0, 0.0]])
    turn_advantages = torch.tensor([[-0.1, 0.2, -0.3], [0.4, 0.0, 0.0], [100.0, 0.0, 0.0]])
    metrics = turn_metrics(turn_values, turn_advantages, spans, torch.tensor([1.0, 1.0, 0.0]))
    # Valid turns of samples 0 and 1: V = [0.2, 0.5, 0.4, 1.0] (mean 0.525, biased var 0.086875),
    # A = [-0.1, 0.2, -0.3, 0.4] (|A| mean 0.25, mean 0.05, biased var 0.0725); num_turns [3, 1];
    # tokens per turn [3, 1, 2, 2] -> 2.0; 4 turns. Sample 2 (masked, value 100) is excluded.
    expected = {
        "critic/turn_value_mean": 0.525,
        "critic/turn_value_std": 0.086875**0.5,
        "advantage/turn_abs_mean_prenorm": 0.25,
        "advantage/turn_std_prenorm": 0.0725**0.5,
        "turn/num_turns_mean": 2.0,
        "turn/num_turns_max": 3.0,
        "turn/tokens_per_turn_mean": 2.0,
        "turn/total_turns": 4.0,
    }
    assert metrics.keys() == expected.keys()
    for key, value in expected.items():
        assert metrics[key] == pytest.approx(value, rel=1e-6), key


def test_turn_metrics_are_empty_below_two_turns() -> None:
    spans = build_turn_spans([[("user", 4), ("assistant", 2)], LOG], seq_len=12)
    metrics = turn_metrics(torch.ones(2, 3), torch.ones(2, 3), spans, torch.tensor([1.0, 0.0]))
    assert metrics == {}


def test_spans_move_to_a_device() -> None:
    spans = build_turn_spans([LOG], seq_len=12).to("cpu")
    assert spans.anchor_pos.device.type == "cpu"


def _reference_turn_gae(
    logs: list[list[tuple[str, int]]],
    rewards: list[float],
    values: list[list[float]],
    penalty: list[list[float]],
    gamma: float,
    lam: float,
) -> tuple[list[list[float]], list[list[float]]]:
    """Slow reference: walk each log, collect turns, run the textbook recursion, paint tokens and anchors."""
    seq = len(values[0])
    advantages, returns = [], []
    for log, reward, row_values, row_penalty in zip(logs, rewards, values, penalty, strict=True):
        turns: list[tuple[int, int]] = []
        position = 0
        for role, n in log:
            if role == "assistant" and n > 0:
                turns.append((position, n))
            position += n
        r = [-sum(row_penalty[s : s + n]) for s, n in turns]
        if turns:
            r[-1] += reward
        v = [row_values[s] for s, _ in turns]
        a = [0.0] * len(turns)
        running = 0.0
        for k in reversed(range(len(turns))):
            next_value = v[k + 1] if k + 1 < len(turns) else 0.0
            running = r[k] + gamma * next_value - v[k] + gamma * lam * running
            a[k] = running
        row_a, row_g = [0.0] * seq, [0.0] * seq
        for k, (s, n) in enumerate(turns):
            row_a[s : s + n] = [a[k]] * n
            row_g[s] = a[k] + v[k]
        advantages.append(row_a)
        returns.append(row_g)
    return advantages, returns


def test_vectorised_turn_gae_matches_a_pure_python_reference_on_random_logs() -> None:
    torch.manual_seed(1)
    rng = random.Random(1)
    for _ in range(200):
        logs: list[list[tuple[str, int]]] = []
        for _ in range(rng.randint(1, 4)):
            log = [("user", rng.randint(1, 3))]
            for _ in range(rng.randint(0, 5)):
                log.append((rng.choice(["assistant", "assistant", "tool", "user"]), rng.randint(0, 3)))
            logs.append(log)
        seq = max(sum(n for _, n in log) for log in logs) + rng.randint(0, 3)
        spans = build_turn_spans(logs, seq)
        batch = len(logs)
        values = torch.randn(batch, seq, dtype=torch.float64)
        penalty = torch.rand(batch, seq, dtype=torch.float64) * 0.1
        rewards = torch.randn(batch, dtype=torch.float64)
        gamma, lam = rng.choice([1.0, rng.random()]), rng.choice([1.0, rng.random()])
        mask = _token_mask(spans)
        validate_turn_spans(spans, mask, torch.zeros(batch))
        result = turn_gae(rewards, values, spans, mask, gamma, lam, lam, penalty)
        ref_a, ref_g = _reference_turn_gae(logs, rewards.tolist(), values.tolist(), penalty.tolist(), gamma, lam)
        torch.testing.assert_close(result.advantages, torch.tensor(ref_a, dtype=torch.float64))
        torch.testing.assert_close(result.returns, torch.tensor(ref_g, dtype=torch.float64))
