"""Reward penalties on hand-built multi-turn Trajectories, tokenised and decoded with the tiny tokenizer."""

import copy
import dataclasses
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest
from transformers import PreTrainedTokenizerBase

from asyncppo.config.runtime import RewardPenaltiesConfig
from asyncppo.models.chat_template import IM_END
from asyncppo.models.tokenizer import load_tokenizer
from asyncppo.rollout.penalties import (
    MIN_REPEATED_WORDS,
    apply_reward_penalties,
    enabled_penalties,
    has_repeated_words,
    split_think,
)
from asyncppo.types import MessageSpan, Role, Trajectory

ALL_ON = RewardPenaltiesConfig(
    penalize_duplicated_reasoning=True,
    penalize_empty_final_answer=True,
    penalize_unwanted_tokens=True,
    penalize_malformed_think_tag=True,
    token_ids_unwanted=[999],  # outside the tiny vocabulary: never generated unless a test puts it in
)
# 25 distinct words: one copy is no repetition, two copies repeat 25 >= MIN_REPEATED_WORDS words.
PARAGRAPH = " ".join(f"step{index}" for index in range(25)) + "."


@pytest.fixture(scope="module")
def tokenizer(tiny_dir: Path) -> PreTrainedTokenizerBase:
    return load_tokenizer(tiny_dir)


@pytest.fixture(scope="module")
def decode(tokenizer: PreTrainedTokenizerBase) -> Callable[[Sequence[int]], str]:
    """As the training run decodes (special tokens kept: the tiny tokenizer's think tags are special)."""
    return lambda token_ids: str(tokenizer.decode(list(token_ids), skip_special_tokens=False))


@pytest.fixture(scope="module")
def build(tokenizer: PreTrainedTokenizerBase) -> Callable[..., Trajectory]:
    """A Trajectory of a user prompt, then the assistant texts (each + <|im_end|>) with a tool span between."""

    def make(turns: Sequence[str], reward: float = 1.0, components: dict[str, float] | None = None) -> Trajectory:
        token_ids: list[int] = []
        loss_mask: list[int] = []
        spans: list[MessageSpan] = []

        def add(role: Role, text: str) -> None:
            tokens = tokenizer.encode(text, add_special_tokens=False)
            token_ids.extend(tokens)
            loss_mask.extend([int(role == "assistant")] * len(tokens))
            spans.append(MessageSpan(role, len(tokens)))

        add("user", "Compute (12 + 7) * 3.")
        for index, text in enumerate(turns):
            if index:
                add("tool", '<tool_response>\n{"result":19}\n</tool_response>')
            add("assistant", text + IM_END)
        return Trajectory(
            token_ids=token_ids,
            loss_mask=loss_mask,
            generation_logprobs=[-0.5 * mask for mask in loss_mask],
            prompt_length=spans[0].num_tokens,
            message_log=spans,
            reward=reward,
            group_id=0,
            sample_index=0,
            policy_version=0,
            last_policy_version=0,
            reward_components=dict(components or {}),
        )

    return make


@pytest.mark.parametrize(
    ("text", "thoughts", "answer", "well_formed"),
    [
        ("57", "", "57", True),
        ("<think>add, then multiply</think>\n57<|im_end|>", "add, then multiply", "57", True),
        ("<think>a<think>b</think>c</think>57", "a\nb\nc", "57", False),  # nested: depth counts
        ("</think>57<think>x</think>", "x", "57", False),  # an end before any start
        ("<think>cut off by the length lim", "cut off by the length lim", "", False),  # never closed
        ("<think>a</think>57<think>b</think>", "a\nb", "57", False),  # two blocks
        ("<think></think>  \n<|im_end|>", "", "", True),  # well formed, but nothing outside the block
        ("<tool_call>\n{}\n</tool_call><|eot_id|></s>", "", "<tool_call>\n{}\n</tool_call>", True),
    ],
)
def test_split_think_separates_thoughts_from_the_answer(text: str, thoughts: str, answer: str, well_formed: bool):
    split = split_think(text, "<think>", "</think>")
    assert (split.thoughts, split.answer, split.well_formed) == (thoughts, answer, well_formed)


def test_repeated_words_need_a_long_non_overlapping_repeat() -> None:
    assert MIN_REPEATED_WORDS == 20
    # "a" * n: the windows at 0 and 20 (the first pair that does not overlap) exist once n >= 40.
    assert not has_repeated_words(["a " * 39])
    assert has_repeated_words(["a " * 40])
    assert not has_repeated_words([PARAGRAPH])
    assert has_repeated_words([PARAGRAPH + " " + PARAGRAPH.upper()])  # case and punctuation are ignored
    assert has_repeated_words([PARAGRAPH, "Then: " + PARAGRAPH])  # across turns
    short = "so 12 + 7 = 19 and 19 * 3 = 57"
    assert not has_repeated_words([f"{short}. Check: {short}.", short])  # restating a result is no loop
    assert not has_repeated_words([])


def test_unwanted_tokens_hit_only_generated_tokens(build, decode) -> None:
    trajectory = build(["57"])
    prompt_token, generated_token = trajectory.token_ids[0], trajectory.token_ids[-2]
    assert trajectory.loss_mask[0] == 0 and trajectory.loss_mask[-2] == 1
    in_prompt = RewardPenaltiesConfig(penalize_unwanted_tokens=True, token_ids_unwanted=[prompt_token])
    generated = RewardPenaltiesConfig(penalize_unwanted_tokens=True, token_ids_unwanted=[generated_token])
    assert apply_reward_penalties([trajectory], in_prompt, decode)[1] == {"unwanted_tokens": 0}
    [penalized], counts = apply_reward_penalties([trajectory], generated, decode)
    assert counts == {"unwanted_tokens": 1} and penalized.reward == 0.0


@pytest.mark.parametrize(
    ("turns", "hit"),
    [
        (["<think>add first</think>" + '<tool_call>{"name": "add"}</tool_call>', "<think>now answer</think>57"], False),
        (["<think>add first</think>x", "<think>a<think>b</think></think>57"], True),  # nested, in a later turn
        (["</think>57"], True),
        (["<think>thinking until the limit"], True),
        (["<think>a</think>57<think>b</think>"], True),
    ],
)
def test_malformed_think_tag_checks_every_turn(build, decode, turns: list[str], hit: bool) -> None:
    settings = RewardPenaltiesConfig(penalize_malformed_think_tag=True)
    [penalized], counts = apply_reward_penalties([build(turns)], settings, decode)
    assert counts == {"malformed_think_tag": int(hit)} and penalized.reward == (0.0 if hit else 1.0)


@pytest.mark.parametrize(
    ("turns", "hit"),
    [
        (['<tool_call>{"name": "add"}</tool_call>', "57"], False),
        (['<tool_call>{"name": "add"}</tool_call>', "<think>done</think>\n 57 "], False),
        (["57", "<think>it is 57</think>  \n"], True),  # only the final turn counts
        (["<think>it is 57</think>"], True),
        (["<think>cut off before any answer"], True),
        ([""], True),  # only <|im_end|> was generated
        (['<tool_call>{"name": "multiply"}</tool_call>'], False),  # tool-call markup is text (max_steps hit)
    ],
)
def test_empty_final_answer_reads_the_last_turn_outside_its_think_block(build, decode, turns, hit) -> None:
    settings = RewardPenaltiesConfig(penalize_empty_final_answer=True)
    [penalized], counts = apply_reward_penalties([build(turns)], settings, decode)
    assert counts == {"empty_final_answer": int(hit)} and penalized.reward == (0.0 if hit else 1.0)


@pytest.mark.parametrize(
    ("turns", "hit"),
    [
        ([f"<think>{PARAGRAPH}</think>x", "<think>The sum is 19, multiply it by 3.</think>57"], False),
        ([f"<think>{PARAGRAPH} {PARAGRAPH}</think>57"], True),  # a re-pasted paragraph
        ([f"<think>{PARAGRAPH}</think>x", f"<think>{PARAGRAPH}</think>57"], True),  # copied into the next turn
        ([f"<think>{'wait, ' * 45}</think>57"], True),  # a loop of one word
        (["<think>call the tool</think>x", "<think>call the tool</think>57"], False),  # a short block may recur
        ([f"<think>plan</think>{PARAGRAPH} {PARAGRAPH}"], False),  # the answer is not reasoning
    ],
)
def test_duplicated_reasoning_looks_for_long_repeats_in_the_thoughts(build, decode, turns, hit) -> None:
    settings = RewardPenaltiesConfig(penalize_duplicated_reasoning=True)
    [penalized], counts = apply_reward_penalties([build(turns)], settings, decode)
    assert counts == {"duplicated_reasoning": int(hit)} and penalized.reward == (0.0 if hit else 1.0)


def test_several_penalties_count_each_hit_and_zero_components(build, decode) -> None:
    components = {"correct": 0.75, "format": 0.25}
    clean = build(["<think>add</think>x", "<think>answer</think>57"], components=components)
    # Empty final answer, two blocks in one turn, and the paragraph repeated: three hits on one trajectory.
    messy = build([f"<think>{PARAGRAPH}</think><think>{PARAGRAPH}</think>"], reward=0.5, components={"c": 0.5})
    already_zero = build(["<think>"], reward=0.0)  # unclosed and empty: counted though the reward is 0 already
    trajectories = [clean, messy, already_zero]
    before = copy.deepcopy(trajectories)
    penalized, counts = apply_reward_penalties(trajectories, ALL_ON, decode)
    assert counts == {
        "duplicated_reasoning": 1,
        "empty_final_answer": 2,
        "unwanted_tokens": 0,
        "malformed_think_tag": 2,
    }
    assert [trajectory.reward for trajectory in penalized] == [1.0, 0.0, 0.0]
    assert penalized[0] is clean and penalized[0].reward_components == components
    assert penalized[1].reward_components == {"c": 0.0}  # names kept, and they still sum to the reward
    assert penalized[1].token_ids == messy.token_ids and penalized[1].loss_mask == messy.loss_mask
    assert trajectories == before  # inputs untouched


def test_disabled_penalties_are_not_counted_or_applied(build, decode) -> None:
    empty = build(["<think>only thinking</think>"])
    settings = RewardPenaltiesConfig(penalize_malformed_think_tag=True)
    [penalized], counts = apply_reward_penalties([empty], settings, decode)
    assert counts == {"malformed_think_tag": 0} and penalized.reward == 1.0  # well formed; the empty answer is off

    def never(token_ids: Sequence[int]) -> str:
        raise AssertionError("nothing to decode when no penalty is on")

    assert apply_reward_penalties([empty], RewardPenaltiesConfig(), never) == ([empty], {})
    unwanted_only = RewardPenaltiesConfig(penalize_unwanted_tokens=True, token_ids_unwanted=[999])
    assert apply_reward_penalties([empty], unwanted_only, never)[1] == {"unwanted_tokens": 0}


def test_settings_say_what_is_enabled() -> None:
    assert not RewardPenaltiesConfig().any_enabled and enabled_penalties(RewardPenaltiesConfig()) == []
    assert RewardPenaltiesConfig(penalize_empty_final_answer=True).any_enabled and ALL_ON.any_enabled
    assert enabled_penalties(ALL_ON) == [
        "duplicated_reasoning",
        "empty_final_answer",
        "unwanted_tokens",
        "malformed_think_tag",
    ]


REASONING_TAGS = ("<reasoning>", "</reasoning>")


@pytest.mark.parametrize(
    ("tags", "turns", "counts"),
    [
        # With the model's own tags the block is read as thoughts: an answer follows, or it is left open.
        (REASONING_TAGS, ["<reasoning>plan</reasoning>57"], {"malformed_think_tag": 0, "empty_final_answer": 0}),
        (REASONING_TAGS, ["<reasoning>it is 57</reasoning>"], {"malformed_think_tag": 0, "empty_final_answer": 1}),
        (REASONING_TAGS, ["<reasoning>cut off"], {"malformed_think_tag": 1, "empty_final_answer": 1}),
        # The same texts under the default <think> tags are plain answers, and <think> is no longer special.
        (None, ["<reasoning>it is 57</reasoning>"], {"malformed_think_tag": 0, "empty_final_answer": 0}),
        (None, ["<reasoning>cut off"], {"malformed_think_tag": 0, "empty_final_answer": 0}),
        (REASONING_TAGS, ["<think>a<think>b</think>57"], {"malformed_think_tag": 0, "empty_final_answer": 0}),
    ],
)
def test_penalties_cut_turns_at_the_configured_thinking_tags(build, decode, tags, turns, counts) -> None:
    settings = RewardPenaltiesConfig(penalize_malformed_think_tag=True, penalize_empty_final_answer=True)
    extra = () if tags is None else (tags,)
    [penalized], hits = apply_reward_penalties([build(turns)], settings, decode, *extra)
    assert hits == counts and penalized.reward == (0.0 if any(counts.values()) else 1.0)


def test_invalid_tool_call_penalty_zeroes_flagged_trajectories(build, decode) -> None:
    flagged = dataclasses.replace(build(["57"], components={"correct": 1.0}), invalid_tool_call=True)
    clean = build(["57"])
    settings = RewardPenaltiesConfig(penalize_invalid_tool_call=True)
    [zeroed, kept], counts = apply_reward_penalties([flagged, clean], settings, decode)
    assert counts == {"invalid_tool_call": 1}
    assert (zeroed.reward, zeroed.reward_components, kept.reward) == (0.0, {"correct": 0.0}, 1.0)
    # Off: the flag alone changes nothing.
    [untouched], counts = apply_reward_penalties([flagged], RewardPenaltiesConfig(), decode)
    assert counts == {} and untouched.reward == 1.0
