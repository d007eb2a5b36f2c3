"""The multi-step tool demo policy: the warm-up's assistant mask, its loss, in-process plays, the cached build."""

import dataclasses
import json
import random
from pathlib import Path

import pytest
import torch

from asyncppo.demo import tool_policy
from asyncppo.demo.tool_policy import (
    TOOL_TASK_RECIPE,
    ToolTaskPlay,
    conversation_batch,
    conversation_tokens,
    ensure_tool_policy,
    play_tool_task,
    render,
    tool_policy_fingerprint,
    warm_up,
    warmup_demonstrations,
)
from asyncppo.demo.tool_task import ChainProblem, demonstrate
from asyncppo.gym.chat_prompt import build_prompt
from asyncppo.gym.protocol import RequestMessage
from asyncppo.models.policy import load_policy
from asyncppo.models.tiny import EOS_TOKEN_ID, PAD_TOKEN_ID, build_tiny_model, build_tiny_tokenizer
from asyncppo.models.tokenizer import load_tokenizer

VALIDATION = Path(__file__).parents[2] / "examples" / "data" / "multi_step" / "validation.jsonl"
# A recipe that builds in a few seconds: for the cache behaviour, not for success.
QUICK_RECIPE = dataclasses.replace(TOOL_TASK_RECIPE, num_steps=3, batch_size=2, warmup_steps=1)


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


def test_the_fingerprint_changes_with_the_recipe_and_the_build_version(monkeypatch):
    fingerprint = tool_policy_fingerprint(QUICK_RECIPE)
    assert tool_policy_fingerprint(QUICK_RECIPE) == fingerprint
    assert tool_policy_fingerprint(dataclasses.replace(QUICK_RECIPE, wrong_fraction=0.2)) != fingerprint
    assert tool_policy_fingerprint(dataclasses.replace(QUICK_RECIPE, seed=1)) != fingerprint
    monkeypatch.setattr(tool_policy, "BUILD_VERSION", tool_policy.BUILD_VERSION + 1)
    assert tool_policy_fingerprint(QUICK_RECIPE) != fingerprint


def test_the_policy_is_built_once_then_reused(tmp_path, monkeypatch):
    torch.manual_seed(0)
    expected_next_draw = torch.rand(1)
    torch.manual_seed(0)
    built = ensure_tool_policy(tmp_path, QUICK_RECIPE)
    assert torch.equal(torch.rand(1), expected_next_draw)  # the build leaves the caller's RNG alone
    assert built.name == f"multi_step-{tool_policy_fingerprint(QUICK_RECIPE)}"
    assert (built / "config.json").is_file() and (built / "tokenizer.json").is_file()
    report = json.loads((built / "warmup.json").read_text())
    assert report["recipe"]["num_steps"] == 3
    assert (
        set(report["validation_sampled"])
        == set(report["validation_greedy"])
        == {"success", "well_formed", "mean_turns"}
    )
    # No staging directory left behind; the lock file that serialises builds of the same model stays.
    assert sorted(path.name for path in tmp_path.iterdir()) == sorted([built.name, f".{built.name}.lock"])

    def fail(*args, **kwargs):
        raise AssertionError("the cached policy was rebuilt")

    monkeypatch.setattr(tool_policy, "warm_up", fail)
    assert ensure_tool_policy(tmp_path, QUICK_RECIPE) == built
    with pytest.raises(AssertionError, match="rebuilt"):
        ensure_tool_policy(tmp_path, dataclasses.replace(QUICK_RECIPE, seed=1))


@pytest.mark.slow
def test_the_demo_tool_policy_is_competent_but_imperfect(shared_cache_dir):
    # About 50 s. Measured for this recipe (torch 2.13 CPU) on the 64 validation rows: sampled success 0.44-0.64
    # across ten sampling seeds (mean 0.58, 0.64 at seed 0), greedy 1.0, well-formed turns ~0.99, 3 turns a play.
    # The band: below 0.35 most groups would be all-wrong (little PPO signal) and the warm-up has regressed (the
    # copies are learned past a sharp transition); above 0.80 PPO has little left to fix.
    # The session's shared cache: the integration runs of the demo use this same build.
    directory = ensure_tool_policy(shared_cache_dir / "models")
    policy, tokenizer = load_policy(directory), load_tokenizer(directory)
    rows = [json.loads(line) for line in VALIDATION.open()]
    sampled = play_tool_task(policy, tokenizer, rows, do_sample=True, seed=0)
    greedy = play_tool_task(policy, tokenizer, rows, do_sample=False)
    assert 0.35 <= sampled.success <= 0.80, sampled
    assert sampled.well_formed >= 0.90, sampled
    assert greedy.success >= 0.85 and greedy.success > sampled.success, greedy
    # The saved weights are the trained ones: the scores recorded at build time are reproduced after loading.
    recorded = json.loads((directory / "warmup.json").read_text())
    assert recorded["validation_sampled"] == dataclasses.asdict(sampled)
    assert recorded["validation_greedy"] == dataclasses.asdict(greedy)
