"""The demo's warmed-up arithmetic policy: what the warm-up trains on, the cached build, its accuracy band."""

import dataclasses
import json
from pathlib import Path

import pytest
import torch

from asyncppo.data.rows import load_rows
from asyncppo.demo import arithmetic_policy
from asyncppo.demo.arithmetic_policy import (
    ARITHMETIC_RECIPE,
    answer_accuracy,
    arithmetic_fingerprint,
    demonstration_batch,
    ensure_arithmetic_policy,
    render_prompt,
    warmup_demonstrations,
)
from asyncppo.demo.arithmetic_task import Demonstration
from asyncppo.models.policy import load_policy
from asyncppo.models.tiny import EOS_TOKEN_ID, build_tiny_tokenizer
from asyncppo.models.tokenizer import load_tokenizer

VALIDATION = Path(__file__).parents[2] / "examples" / "data" / "arithmetic" / "validation.jsonl"
# A recipe that builds in about a second: for the cache behaviour, not for accuracy.
QUICK_RECIPE = dataclasses.replace(ARITHMETIC_RECIPE, num_steps=3, batch_size=4, warmup_steps=1)


@pytest.fixture(scope="module")
def tokenizer():
    return build_tiny_tokenizer(ARITHMETIC_RECIPE.spec.vocab_size)


def test_prompt_plus_answer_and_eos_is_the_chat_rendering_of_the_whole_conversation(tokenizer):
    question, answer = "What is 7+12?", "19"
    prompt_ids = tokenizer.encode(render_prompt(tokenizer, question), add_special_tokens=False)
    trained = [*prompt_ids, *tokenizer.encode(answer, add_special_tokens=False), EOS_TOKEN_ID]
    conversation = [{"role": "user", "content": question}, {"role": "assistant", "content": answer}]
    full_text = tokenizer.apply_chat_template(conversation, tokenize=False)
    # The template closes the turn with "<|im_end|>\n"; generation stops at <|im_end|>, so "\n" is never trained.
    assert tokenizer.encode(full_text, add_special_tokens=False) == [*trained, *tokenizer.encode("\n")]


def test_the_warm_up_loss_covers_only_the_answer_digits_and_eos(tokenizer):
    batch = [Demonstration("What is 1+2?", "3", True), Demonstration("What is 19+19?", "37", False)]
    input_ids, attention_mask, labels = demonstration_batch(tokenizer, batch, {})
    for row, answer in enumerate(["3", "37"]):
        trained = labels[row][labels[row] != -100].tolist()
        assert trained == [*tokenizer.encode(answer, add_special_tokens=False), EOS_TOKEN_ID]
        # Labels sit on the same positions as the tokens they name (the model shifts them itself).
        positions = (labels[row] != -100).nonzero().flatten()
        assert input_ids[row, positions].tolist() == trained
    # Row 0 is two tokens shorter ("1+2" vs "19+19") and one shorter in the answer: three pad positions.
    assert attention_mask.sum(dim=1).tolist() == [attention_mask.shape[1] - 3, attention_mask.shape[1]]


def test_the_warm_up_never_shows_a_validation_problem():
    validation_prompts = {row["prompt"] for row in load_rows(VALIDATION)}
    shown = {demonstration.question for demonstration in warmup_demonstrations(ARITHMETIC_RECIPE)}
    assert len(shown) == 336 and not shown & validation_prompts


def test_the_fingerprint_changes_with_the_recipe_and_the_build_version(monkeypatch):
    fingerprint = arithmetic_fingerprint(QUICK_RECIPE)
    assert arithmetic_fingerprint(QUICK_RECIPE) == fingerprint
    assert arithmetic_fingerprint(dataclasses.replace(QUICK_RECIPE, wrong_fraction=0.2)) != fingerprint
    assert arithmetic_fingerprint(dataclasses.replace(QUICK_RECIPE, seed=1)) != fingerprint
    monkeypatch.setattr(arithmetic_policy, "BUILD_VERSION", arithmetic_policy.BUILD_VERSION + 1)
    assert arithmetic_fingerprint(QUICK_RECIPE) != fingerprint


def test_the_policy_is_built_once_then_reused(tmp_path, monkeypatch):
    torch.manual_seed(0)
    expected_next_draw = torch.rand(1)
    torch.manual_seed(0)
    built = ensure_arithmetic_policy(tmp_path, QUICK_RECIPE)
    assert torch.equal(torch.rand(1), expected_next_draw)  # the build leaves the caller's RNG alone
    assert built.name == f"arithmetic-{arithmetic_fingerprint(QUICK_RECIPE)}"
    assert (built / "config.json").is_file() and (built / "tokenizer.json").is_file()
    assert json.loads((built / "warmup.json").read_text())["recipe"]["num_steps"] == 3
    # No staging directory left behind; the lock file that serialises builds of the same model stays.
    assert sorted(path.name for path in tmp_path.iterdir()) == sorted([built.name, f".{built.name}.lock"])

    def fail(*args, **kwargs):
        raise AssertionError("the cached policy was rebuilt")

    monkeypatch.setattr(arithmetic_policy, "warm_up", fail)
    assert ensure_arithmetic_policy(tmp_path, QUICK_RECIPE) == built
    with pytest.raises(AssertionError, match="rebuilt"):
        ensure_arithmetic_policy(tmp_path, dataclasses.replace(QUICK_RECIPE, seed=1))


@pytest.mark.slow
def test_the_demo_policy_is_competent_but_imperfect(shared_cache_dir):
    # About 20-30 s on 2 shared cores. Measured for this recipe (torch 2.13 CPU): sampled accuracy on the 64
    # validation prompts 0.50-0.64 across ten sampling seeds (mean 0.57), greedy 0.98, well-formed ~0.99.
    # The band: below 0.40 most prompt groups of a correctness reward would be all-wrong (little signal) and
    # the warm-up has regressed; above 0.80 PPO has little left to fix in the demo.
    # The session's shared cache: the integration runs of the demo use this same build.
    directory = ensure_arithmetic_policy(shared_cache_dir / "models")
    policy, tokenizer = load_policy(directory), load_tokenizer(directory)
    rows = load_rows(VALIDATION)
    sampled = answer_accuracy(policy, tokenizer, rows, do_sample=True, seed=0)
    greedy = answer_accuracy(policy, tokenizer, rows, do_sample=False)
    assert 0.40 <= sampled.accuracy <= 0.80, sampled
    assert sampled.well_formed >= 0.90, sampled
    assert greedy.accuracy >= 0.80 and greedy.accuracy > sampled.accuracy, greedy
    # The saved weights are the trained ones: the accuracy recorded at build time is reproduced after loading.
    recorded = json.loads((directory / "warmup.json").read_text())
    assert recorded["validation_sampled"] == dataclasses.asdict(sampled)
    assert recorded["validation_greedy"] == dataclasses.asdict(greedy)
