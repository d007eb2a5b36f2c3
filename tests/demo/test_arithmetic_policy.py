"""The demo's warmed-up arithmetic policy: what the warm-up trains on (the cached build and its accuracy band:
test_policy_builds.py)."""

from pathlib import Path

import pytest

from asyncppo.data.rows import load_rows
from asyncppo.demo.arithmetic_policy import ARITHMETIC_RECIPE, demonstration_batch, render_prompt, warmup_demonstrations
from asyncppo.demo.arithmetic_task import Demonstration
from asyncppo.models.tiny import EOS_TOKEN_ID, build_tiny_tokenizer

VALIDATION = Path(__file__).parents[2] / "examples" / "data" / "arithmetic" / "validation.jsonl"


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
