"""The multi-step tool demo policy: the warm-up's assistant mask, its loss, in-process plays (the cached build and
its success band: test_policy_builds.py)."""

import dataclasses
import json
import random
from pathlib import Path

import pytest
import torch

from asyncppo.demo.tool_policy import (
    TOOL_TASK_RECIPE,
    ToolTaskPlay,
    conversation_batch,
    conversation_tokens,
    render,
    warm_up,
    warmup_demonstrations,
)
from asyncppo.demo.tool_task import ChainProblem, demonstrate
from asyncppo.gym.chat_prompt import build_prompt
from asyncppo.gym.protocol import RequestMessage
from asyncppo.models.tiny import EOS_TOKEN_ID, PAD_TOKEN_ID, build_tiny_model, build_tiny_tokenizer

VALIDATION = Path(__file__).parents[2] / "examples" / "data" / "multi_step" / "validation.jsonl"


@pytest.fixture(scope="module")
def tokenizer():
    return build_tiny_tokenizer(TOOL_TASK_RECIPE.spec.vocab_size)


def encode(tokenizer, text: str) -> list[int]:
    return tokenizer.encode(text, add_special_tokens=False)


def plays() -> list[list[dict]]:
    rng = random.Random(0)
    return [demonstrate(ChainProblem(12, 7, 3), mistake, rng).messages for mistake in ("none", "copy", "answer")]


@pytest.mark.parametrize("index", [0, 1, 2])
def test_the_assistant_mask_covers_exactly_what_each_turn_generates(tokenizer, index):
    messages = plays()[index]
    ids, mask = conversation_tokens(tokenizer, messages)
    # Reference by prefix rendering: turn k's prompt is the conversation before it with the generation prompt; the
    # turn generates its text and eos, and the template then writes one "\n" token that nobody generates.
    expected = [False] * len(ids)
    for position, message in enumerate(messages):
        if message["role"] != "assistant":
            continue
        prompt = encode(tokenizer, render(tokenizer, messages[:position], add_generation_prompt=True))
        through_turn = encode(tokenizer, render(tokenizer, messages[: position + 1], add_generation_prompt=False))
        assert ids[: len(through_turn)] == through_turn and through_turn[: len(prompt)] == prompt
        assert through_turn[-2:] == [EOS_TOKEN_ID, *encode(tokenizer, "\n")]
        expected[len(prompt) : len(through_turn) - 1] = [True] * (len(through_turn) - 1 - len(prompt))
    assert mask == expected
    # Three turns, each closed by eos, and the masked text is the three generations back to back.
    assert [token for token, masked in zip(ids, mask, strict=True) if masked].count(EOS_TOKEN_ID) == 3
    masked_text = tokenizer.decode([token for token, masked in zip(ids, mask, strict=True) if masked])
    assert masked_text.startswith(
        '<tool_call>\n{"name": "add", "arguments": {"a": 12, "b": 7}}\n</tool_call><|im_end|>'
    )


def test_labels_are_the_assistant_tokens_and_padding_is_masked(tokenizer):
    rng = random.Random(0)
    demonstrations = [
        demonstrate(ChainProblem(1, 2, 3), "none", rng),
        demonstrate(ChainProblem(12, 17, 9), "none", rng),
    ]
    input_ids, attention_mask, labels = conversation_batch(tokenizer, demonstrations)
    for row, demonstration in enumerate(demonstrations):
        ids, mask = conversation_tokens(tokenizer, demonstration.messages)
        assert input_ids[row, : len(ids)].tolist() == ids and attention_mask[row].sum() == len(ids)
        assert labels[row, : len(ids)].tolist() == [
            token if masked else -100 for token, masked in zip(ids, mask, strict=True)
        ]
        assert (labels[row, len(ids) :] == -100).all()
    # Every digit is one token. Row 0 against row 1, in digits: question 3 vs 5, add's arguments 2 vs 4, the sum
    # 1 vs 2 (tool response, multiply's a), the product 1 vs 3 (tool response, answer): 2 + 2 + 2*1 + 2*2 = 10.
    assert attention_mask.sum(dim=1).tolist() == [attention_mask.shape[1] - 10, attention_mask.shape[1]]


def test_a_short_warm_up_lowers_the_loss_on_the_assistant_tokens(tokenizer):
    recipe = dataclasses.replace(TOOL_TASK_RECIPE, num_steps=30, batch_size=4, warmup_steps=5)
    model = build_tiny_model(recipe.spec)
    batch = conversation_batch(tokenizer, warmup_demonstrations(recipe)[:16])

    def loss() -> float:
        with torch.no_grad():
            input_ids, attention_mask, labels = batch
            return model(input_ids=input_ids, attention_mask=attention_mask, labels=labels).loss.item()

    before = loss()
    warm_up(model, tokenizer, recipe)
    # From ~ln(300) = 5.7 at random init; 30 small steps start on the constant tool-call format (measured 2.7).
    assert loss() < before - 1.5


def scripted_play(tokenizer, messages: list[dict]) -> ToolTaskPlay:
    """Feeds each assistant turn's rendered ids to a play, checking every prompt against the policy server's."""
    play = ToolTaskPlay.start(tokenizer, ChainProblem(12, 7, 3).row())
    history = [RequestMessage.model_validate(messages[0])]  # what the agent sends, token fields included
    for index, message in enumerate(messages[1:], start=1):
        if message["role"] == "tool":
            history.append(RequestMessage.model_validate(message))
            continue
        prompt = encode(tokenizer, render(tokenizer, messages[:index], add_generation_prompt=True))
        assert play.prompt == build_prompt(tokenizer, history, None, EOS_TOKEN_ID) == prompt
        through_turn = encode(tokenizer, render(tokenizer, messages[: index + 1], add_generation_prompt=False))
        generated = through_turn[len(prompt) : -1]  # the turn's text and eos, without the template's "\n"
        assert not play.done and generated[-1] == EOS_TOKEN_ID
        play.advance(tokenizer, [*generated, PAD_TOKEN_ID, PAD_TOKEN_ID], last_turn=False)  # pads after eos: ignored
        tokens = {"prompt_token_ids": prompt, "generation_token_ids": generated}
        history.append(
            RequestMessage.model_validate(message | tokens | {"generation_log_probs": [0.0] * len(generated)})
        )
    assert play.done
    return play


def test_a_scripted_correct_play_earns_the_reward_through_prompts_the_server_would_build(tokenizer):
    play = scripted_play(tokenizer, plays()[0])
    assert (play.reward, play.num_turns, play.num_well_formed, play.final_text) == (1.0, 3, 3, "57")
    assert [message["content"] for message in play.messages if message["role"] == "tool"] == [
        '{"result":19}',
        '{"result":57}',
    ]


@pytest.mark.parametrize("mistake_index", [1, 2])
def test_a_scripted_play_with_a_mistake_is_well_formed_but_earns_nothing(tokenizer, mistake_index):
    play = scripted_play(tokenizer, plays()[mistake_index])
    assert (play.reward, play.num_turns, play.num_well_formed) == (0.0, 3, 3)


def test_a_malformed_call_or_a_turn_cut_off_ends_the_play(tokenizer):
    row = ChainProblem(12, 7, 3).row()
    broken = encode(tokenizer, '<tool_call>\n{"name": "add", "arguments": {"a": 12, "b": 7}\n</tool_call>')
    play = ToolTaskPlay.start(tokenizer, row)
    play.advance(tokenizer, [*broken, EOS_TOKEN_ID], last_turn=False)
    # The block does not parse, so it is the final text (as parse_generation leaves it); its last number is 7.
    assert play.done and play.num_well_formed == 0 and play.reward == 0.0
    cut = ToolTaskPlay.start(tokenizer, row)
    cut.advance(
        tokenizer,
        encode(tokenizer, '<tool_call>\n{"name": "add", "arguments": {"a": 12, "b": 7}}\n</tool_call>'),
        last_turn=False,
    )
    assert cut.done and cut.num_well_formed == 0 and len(cut.messages) == 1


def test_the_warm_up_never_shows_a_validation_problem():
    validation = {json.loads(line)["responses_create_params"]["input"][0]["content"] for line in VALIDATION.open()}
    shown = {demonstration.messages[0]["content"] for demonstration in warmup_demonstrations(TOOL_TASK_RECIPE)}
    # 12000 draws from the 3136 train problems leave ~2% of them unseen: (1 - 1/3136)^12000 = 0.022.
    assert len(shown) > 3000 and len(validation) == 64 and not shown & validation
