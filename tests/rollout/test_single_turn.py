"""run_single_turn_rollouts with the real HFGenerator on the tiny model: token-exact, scored, grouped Trajectories."""

from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from asyncppo.generation.hf_generator import HFGenerator
from asyncppo.generation.protocol import SamplingParams
from asyncppo.models.policy import load_policy, token_logprobs
from asyncppo.models.tiny import EOS_TOKEN_ID, PAD_TOKEN_ID
from asyncppo.models.tokenizer import load_tokenizer
from asyncppo.rollout.rewards import RewardFunctionError, exact_match_reward
from asyncppo.rollout.single_turn import render_prompt, run_single_turn_groups, run_single_turn_rollouts
from asyncppo.types import MessageSpan, Trajectory, collate_trajectories

TEMPERATURE = 0.8


@pytest.fixture
def policy(tiny_dir: Path) -> PreTrainedModel:
    return load_policy(tiny_dir)


@pytest.fixture
def tokenizer(tiny_dir: Path) -> PreTrainedTokenizerBase:
    return load_tokenizer(tiny_dir)


@pytest.fixture
def engine(policy: PreTrainedModel) -> Iterator[HFGenerator]:
    generator = HFGenerator(
        policy,
        eos_token_ids=[EOS_TOKEN_ID],
        pad_token_id=PAD_TOKEN_ID,
        max_batch_size=64,
        device="cpu",
        seed=0,
        max_context_length=512,
    )
    yield generator
    generator.close()


def rollouts(engine: HFGenerator, tokenizer: PreTrainedTokenizerBase, rows: list[dict[str, Any]], **overrides: Any):
    arguments: dict[str, Any] = {
        "num_generations_per_prompt": 3,
        "sampling": SamplingParams(temperature=TEMPERATURE, max_new_tokens=12),
        "reward_fn": lambda text, row: float(len(text)),
        "group_id_start": 100,
        "system_prompt": None,
        "prompt_key": "prompt",
        "messages_key": "messages",
        "max_prompt_tokens": 256,
    }
    return run_single_turn_rollouts(engine, tokenizer, rows, **(arguments | overrides))


ROWS = [
    {"prompt": "What is 2+3?", "answer": "5", "id": "a"},
    {"prompt": "Hello, I am Ada. How are you?", "answer": "fine", "id": "b"},
]


def test_trajectories_are_token_exact_and_their_logprobs_match_a_recompute(
    engine: HFGenerator, tokenizer: PreTrainedTokenizerBase, policy: PreTrainedModel
) -> None:
    trajectories = rollouts(engine, tokenizer, ROWS)
    assert engine.stats().num_batches == 1  # all 2 x 3 requests went in at once and shared one batch
    assert [(t.group_id, t.sample_index) for t in trajectories] == [(g, s) for g in (100, 101) for s in range(3)]
    for trajectory, row in zip(trajectories, [ROWS[0]] * 3 + [ROWS[1]] * 3, strict=True):
        # transformers' own tokenizing path, independent of how run_single_turn_rollouts renders.
        encoded = tokenizer.apply_chat_template(
            [{"role": "user", "content": row["prompt"]}], tokenize=True, add_generation_prompt=True, return_dict=True
        )
        prompt_ids = encoded["input_ids"]  # pyright: ignore[reportIndexIssue, reportCallIssue, reportArgumentType]
        prompt_length = trajectory.prompt_length
        assert trajectory.token_ids[:prompt_length] == prompt_ids
        assert trajectory.loss_mask == [0] * prompt_length + [1] * (len(trajectory.token_ids) - prompt_length)
        assert trajectory.generation_logprobs[:prompt_length] == [0.0] * prompt_length
        ids = torch.tensor([trajectory.token_ids])
        with torch.no_grad():
            expected = token_logprobs(policy, ids, torch.ones_like(ids), TEMPERATURE)[0]
        generated = torch.tensor(trajectory.generation_logprobs[prompt_length:])
        torch.testing.assert_close(generated, expected[prompt_length:], rtol=0, atol=1e-5)
        assert trajectory.message_log == [
            MessageSpan("user", prompt_length),
            MessageSpan("assistant", trajectory.num_generated_tokens),
        ]
        assert trajectory.task == {"answer": row["answer"], "id": row["id"]}
        assert trajectory.truncated == (
            trajectory.num_generated_tokens == 12 and trajectory.token_ids[-1] != tokenizer.eos_token_id
        )
        assert (trajectory.policy_version, trajectory.last_policy_version) == (0, 0)
    batch = collate_trajectories(trajectories, pad_token_id=0)  # the output is what training consumes
    assert batch.group_ids.tolist() == [100] * 3 + [101] * 3


def test_the_reward_sees_the_response_decoded_without_special_tokens_and_the_full_row(
    engine: HFGenerator, tokenizer: PreTrainedTokenizerBase
) -> None:
    seen: list[tuple[str, Mapping[str, Any]]] = []

    def record(text: str, row: Mapping[str, Any]) -> float:
        seen.append((text, row))
        return 0.5 * len(seen)

    trajectories = rollouts(engine, tokenizer, ROWS, reward_fn=record, num_generations_per_prompt=2)
    assert [t.reward for t in trajectories] == [0.5, 1.0, 1.5, 2.0]
    for trajectory, (text, row) in zip(trajectories, seen, strict=True):
        generated = trajectory.token_ids[trajectory.prompt_length :]
        assert text == tokenizer.decode(generated, skip_special_tokens=True)
        assert "<|im_end|>" not in text
        assert row is ROWS[trajectory.group_id - 100]


def test_a_system_prompt_and_a_messages_list_give_one_span_per_message(
    engine: HFGenerator, tokenizer: PreTrainedTokenizerBase
) -> None:
    messages = [
        {"role": "user", "content": "What is 2+3?"},
        {"role": "assistant", "content": "5"},
        {"role": "user", "content": "And 4+4?"},
    ]
    rows = [{"prompt": "Hi", "answer": "x"}, {"messages": messages, "answer": "8"}]
    by_prompt, by_messages = rollouts(engine, tokenizer, rows, system_prompt="Be brief.", num_generations_per_prompt=1)
    assert [span.role for span in by_prompt.message_log] == ["system", "user", "assistant"]
    assert [span.role for span in by_messages.message_log] == ["user", "assistant", "user", "assistant"]
    # Each span is exactly the rendering of its message; the generation prompt joins the last prompt span.
    spans = by_messages.message_log
    first = tokenizer.decode(by_messages.token_ids[: spans[0].num_tokens])
    last = tokenizer.decode(by_messages.token_ids[sum(s.num_tokens for s in spans[:2]) : by_messages.prompt_length])
    assert first == "<|im_start|>user\nWhat is 2+3?<|im_end|>\n"
    assert last == "<|im_start|>user\nAnd 4+4?<|im_end|>\n<|im_start|>assistant\n"
    assert "Be brief." not in tokenizer.decode(by_messages.token_ids)  # system_prompt applies to `prompt` rows only
    assert by_messages.task == {"answer": "8"}


def test_a_template_that_is_not_prefix_stable_gives_a_single_user_span(tokenizer: PreTrainedTokenizerBase) -> None:
    # The message count in front changes with every prefix, so prefixes cannot be diffed.
    tokenizer.chat_template = "{{ messages | length }}{% for m in messages %}[{{ m.role }}]{{ m.content }}{% endfor %}"
    messages = [{"role": "system", "content": "S"}, {"role": "user", "content": "U"}]
    prompt_ids, spans = render_prompt(tokenizer, messages)
    assert tokenizer.decode(prompt_ids) == "2[system]S[user]U"
    assert spans == [MessageSpan("user", len(prompt_ids))]


def test_a_prompt_over_max_prompt_tokens_is_rejected_before_anything_is_generated(
    engine: HFGenerator, tokenizer: PreTrainedTokenizerBase
) -> None:
    rows = [{"prompt": "short", "answer": "1"}, {"prompt": "long " * 40, "answer": "2"}]
    with pytest.raises(ValueError, match=r"row 1: the prompt has \d+ tokens, over max_prompt_tokens=30"):
        rollouts(engine, tokenizer, rows, max_prompt_tokens=30)
    assert engine.stats().num_requests == 0


def test_a_row_without_prompt_or_messages_is_rejected_naming_its_keys(
    engine: HFGenerator, tokenizer: PreTrainedTokenizerBase
) -> None:
    with pytest.raises(
        ValueError, match=r"row 0 has neither 'messages' nor 'prompt'; its keys are \['answer', 'question'\]"
    ):
        rollouts(engine, tokenizer, [{"question": "2+2?", "answer": "4"}])


def test_truncated_follows_the_finish_reason(engine: HFGenerator, tokenizer: PreTrainedTokenizerBase) -> None:
    trajectories: list[Trajectory] = rollouts(
        engine, tokenizer, ROWS, sampling=SamplingParams(max_new_tokens=2), reward_fn=exact_match_reward
    )
    for trajectory in trajectories:
        stopped = trajectory.token_ids[-1] == tokenizer.eos_token_id
        assert trajectory.truncated == (not stopped)
        assert trajectory.num_generated_tokens == 2 or stopped


def test_a_nan_reward_fails_the_rollout_naming_the_reward_function_and_the_row(
    engine: HFGenerator, tokenizer: PreTrainedTokenizerBase
) -> None:
    def flaky_reward(text: str, row: Mapping[str, Any]) -> float:
        return float("nan") if row["id"] == "b" else 1.0

    with pytest.raises(
        RewardFunctionError, match=r"flaky_reward returned nan \(a float\) for row 1 \(prompt group 101, sample 0\)"
    ):
        rollouts(engine, tokenizer, ROWS, reward_fn=flaky_reward)


def _group_outcomes(engine: HFGenerator, tokenizer: PreTrainedTokenizerBase, reward_fn: Any, max_failed: int | None):
    return run_single_turn_groups(
        engine,
        tokenizer,
        [{**ROWS[0], "id": row_id} for row_id in "abcd"],
        num_generations_per_prompt=2,
        sampling=SamplingParams(temperature=TEMPERATURE, max_new_tokens=3),
        reward_fn=reward_fn,
        group_id_start=10,
        system_prompt=None,
        prompt_key="prompt",
        messages_key="messages",
        max_prompt_tokens=256,
        reward_timeout_s=5.0,
        max_failed_groups=max_failed,
    )


def test_a_failing_reward_fails_only_its_own_group(engine: HFGenerator, tokenizer: PreTrainedTokenizerBase) -> None:
    scored: list[str] = []

    def fails_on_b(text: str, row: Mapping[str, Any]) -> float:
        scored.append(row["id"])
        if row["id"] == "b":
            raise ValueError("cannot grade b")
        return 1.0

    outcomes = _group_outcomes(engine, tokenizer, fails_on_b, max_failed=None)
    assert [type(outcome).__name__ for outcome in outcomes] == ["list", "RewardFunctionError", "list", "list"]
    assert str(outcomes[1]).startswith(
        f"reward function {__name__}.test_a_failing_reward_fails_only_its_own_group.<locals>.fails_on_b raised "
        "ValueError: cannot grade b for row 1 (prompt group 11, sample 0); row: "
    )
    assert [[t.group_id for t in outcome] for outcome in outcomes if isinstance(outcome, list)] == [
        [10, 10],
        [12, 12],
        [13, 13],
    ]
    assert scored == ["a", "a", "b", "c", "c", "d", "d"]  # the failed group's second sample is not scored


def test_past_the_failure_allowance_the_remaining_groups_are_left_unscored(
    engine: HFGenerator, tokenizer: PreTrainedTokenizerBase
) -> None:
    scored: list[str] = []

    def fails_on_a_and_b(text: str, row: Mapping[str, Any]) -> float:
        scored.append(row["id"])
        if row["id"] in "ab":
            raise ValueError("no")
        return 1.0

    outcomes = _group_outcomes(engine, tokenizer, fails_on_a_and_b, max_failed=1)
    # Group a fails (1 of 1 allowed), b fails (over the allowance): c and d are never handed to the function.
    assert [type(outcome).__name__ for outcome in outcomes] == [
        "RewardFunctionError",
        "RewardFunctionError",
        "UnscoredGroupError",
        "UnscoredGroupError",
    ]
    assert str(outcomes[2]) == "prompt group 12 was not scored: 2 groups failed"
    assert scored == ["a", "b"]


def test_a_row_budget_field_sets_each_samples_max_new_tokens_capped_by_the_profile(
    engine: HFGenerator, tokenizer: PreTrainedTokenizerBase
) -> None:
    # ignore_eos: each response is exactly its budget. Row 0's one int covers its 3 samples; row 1 gives one
    # budget per sample, and its 20 is capped at the profile's 12.
    rows = [{**ROWS[0], "budget": 5}, {**ROWS[1], "budget": [3, 20, 7]}]
    sampling = SamplingParams(temperature=TEMPERATURE, max_new_tokens=12, ignore_eos=True)
    trajectories = rollouts(engine, tokenizer, rows, sampling=sampling, max_new_tokens_key="budget")
    assert [t.num_generated_tokens for t in trajectories] == [5, 5, 5, 3, 12, 7]
    assert all(t.truncated for t in trajectories)  # every one ended at its budget
    assert trajectories[3].task == {"answer": "fine", "id": "b", "budget": [3, 20, 7]}  # the field stays a task field
    assert engine.stats().num_batches == 1  # different budgets still share one batch


@pytest.mark.parametrize(
    ("budget", "shown"),
    [(0, "0"), (True, "True"), ("8", "'8'"), (2.0, "2.0"), ([4, 4], r"\[4, 4\]"), ([4, -1, 4], r"\[4, -1, 4\]")],
)
def test_a_bad_row_budget_is_rejected_naming_the_row_the_key_and_the_value_before_generating(
    engine: HFGenerator, tokenizer: PreTrainedTokenizerBase, budget: Any, shown: str
) -> None:
    rows = [{**ROWS[0], "budget": 4}, {**ROWS[1], "budget": budget}]
    expected = rf"row 1 \(prompt group 101\): 'budget' \(data.max_new_tokens_key\) must be .* list of 3 .*got {shown}$"
    with pytest.raises(ValueError, match=expected):
        rollouts(engine, tokenizer, rows, max_new_tokens_key="budget")
    with pytest.raises(ValueError, match=r"row 0 \(prompt group 100\) has no response budget field 'budget'"):
        rollouts(engine, tokenizer, ROWS, max_new_tokens_key="budget")
    assert engine.stats().num_requests == 0
