"""The CPU demo's starting policy: the tiny model after a short supervised warm-up on noisy addition answers.

A tiny model from random init does not learn a multi-token answer from a terminal reward, so the demo starts
from a competent-but-imperfect policy: trained on demonstrations of which 30% are wrong, it samples the right
answer ~57% of the time (greedy ~98%), and PPO with a correctness reward fixes the rest. The trainer's model
builder calls `ensure_arithmetic_policy` (cached build, reused after). Letters: B batch, S sequence.
"""

import hashlib
import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from transformers import GenerationMixin, PreTrainedModel, PreTrainedTokenizerBase

from asyncppo.data.rows import prompt_messages
from asyncppo.demo.arithmetic_task import (
    DEFAULT_MAX_OPERAND,
    DEMO_NUM_VALIDATION,
    DEMO_SPLIT_SEED,
    Demonstration,
    is_correct_answer,
    make_arithmetic_splits,
    make_demonstrations,
)
from asyncppo.demo.shipped import shipped_or_built
from asyncppo.demo.supervised_warmup import Batch, eos_and_pad, supervised_warm_up
from asyncppo.models.tiny import TINY, TinyModelSpec, build_tiny_model, build_tiny_tokenizer

# Bump when the warm-up procedure changes in a way the recipe does not capture, so caches rebuild.
BUILD_VERSION = 1


@dataclass(frozen=True)
class WarmupRecipe:
    """Everything that determines the warm-up; hashed (with the data and BUILD_VERSION) into the cache name."""

    spec: TinyModelSpec = TINY
    max_operand: int = DEFAULT_MAX_OPERAND
    num_validation: int = DEMO_NUM_VALIDATION
    split_seed: int = DEMO_SPLIT_SEED
    wrong_fraction: float = 0.3
    num_steps: int = 600
    batch_size: int = 128
    learning_rate: float = 3e-3
    warmup_steps: int = 20
    seed: int = 0


ARITHMETIC_RECIPE = WarmupRecipe()


def warmup_demonstrations(recipe: WarmupRecipe) -> list[Demonstration]:
    """The warm-up's examples, drawn from the train split only (validation problems are never shown)."""
    train, _ = make_arithmetic_splits(recipe.num_validation, recipe.split_seed, recipe.max_operand)
    return make_demonstrations(train, recipe.num_steps * recipe.batch_size, recipe.wrong_fraction, recipe.seed)


def arithmetic_fingerprint(recipe: WarmupRecipe) -> str:
    """Short hash of the recipe, the demonstrations it produces and BUILD_VERSION."""
    data = "\n".join(f"{d.question}\t{d.answer}" for d in warmup_demonstrations(recipe))
    payload = json.dumps(
        {
            "recipe": asdict(recipe),
            "data_sha256": hashlib.sha256(data.encode()).hexdigest(),
            "build_version": BUILD_VERSION,
        },
        sort_keys=True,
    )
    return hashlib.sha256(payload.encode()).hexdigest()[:12]


def render_prompt(tokenizer: PreTrainedTokenizerBase, question: str) -> str:
    """The chat-template text the policy sees before answering, as the trainer renders a `prompt` row."""
    text = tokenizer.apply_chat_template(
        prompt_messages({"prompt": question}), tokenize=False, add_generation_prompt=True
    )
    assert isinstance(text, str)
    return text


def demonstration_batch(
    tokenizer: PreTrainedTokenizerBase, demonstrations: list[Demonstration], prompt_cache: dict[str, list[int]]
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(input_ids, attention_mask, labels) [B, S], right-padded; labels are -100 except on answer + eos."""
    eos, pad = eos_and_pad(tokenizer)
    sequences = []
    for demonstration in demonstrations:
        if demonstration.question not in prompt_cache:
            text = render_prompt(tokenizer, demonstration.question)
            prompt_cache[demonstration.question] = tokenizer.encode(text, add_special_tokens=False)
        prompt = prompt_cache[demonstration.question]
        # The answer then <|im_end|>: exactly what the generator must emit, ending the turn.
        completion = [*tokenizer.encode(demonstration.answer, add_special_tokens=False), eos]
        sequences.append((prompt, completion))
    length = max(len(prompt) + len(completion) for prompt, completion in sequences)
    input_ids = torch.full((len(sequences), length), pad)
    labels = torch.full((len(sequences), length), -100)
    attention_mask = torch.zeros((len(sequences), length), dtype=torch.long)
    for row, (prompt, completion) in enumerate(sequences):
        end = len(prompt) + len(completion)
        input_ids[row, :end] = torch.tensor(prompt + completion)
        labels[row, len(prompt) : end] = torch.tensor(completion)
        attention_mask[row, :end] = 1
    return input_ids, attention_mask, labels


def warm_up(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, recipe: WarmupRecipe) -> float:
    """Supervised training on the recipe's demonstrations (see supervised_warm_up).

    Returns the mean loss per answer token over the last 10% of steps.
    """
    demonstrations = warmup_demonstrations(recipe)
    prompt_cache: dict[str, list[int]] = {}

    def batch_at(step: int) -> Batch:
        start = step * recipe.batch_size
        return demonstration_batch(tokenizer, demonstrations[start : start + recipe.batch_size], prompt_cache)

    return supervised_warm_up(
        model,
        batch_at,
        num_steps=recipe.num_steps,
        learning_rate=recipe.learning_rate,
        warmup_steps=recipe.warmup_steps,
    )


@dataclass(frozen=True)
class AnswerAccuracy:
    """Exact-match accuracy and the share of answers that are digits followed by eos."""

    accuracy: float
    well_formed: float


@torch.no_grad()
def answer_accuracy(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    rows: list[dict[str, Any]],
    do_sample: bool,
    seed: int = 0,
    max_new_tokens: int = 8,
) -> AnswerAccuracy:
    """Accuracy on `prompt`/`answer` rows, sampling at temperature 1 (top_k 0, top_p 1) or greedy.

    generate() is fine for this measurement only: nothing here feeds logprobs into training.
    """
    eos, pad = eos_and_pad(tokenizer)
    # PreTrainedModel itself has no generate() in transformers 5; causal LM classes mix it in.
    assert isinstance(model, GenerationMixin), f"{type(model).__name__} cannot generate"
    side = tokenizer.padding_side
    tokenizer.padding_side = "left"  # generation continues from the last position of every row
    try:
        texts = [render_prompt(tokenizer, row["prompt"]) for row in rows]
        encoded = tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=False)
    finally:
        tokenizer.padding_side = side
    sampling: dict[str, Any] = {"top_k": 0, "top_p": 1.0, "temperature": 1.0} if do_sample else {}
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        # generate()'s self-type protocol (GenerativePreTrainedModel) does not match transformers' own classes.
        output = model.generate(  # pyright: ignore[reportAttributeAccessIssue]
            **encoded,
            **sampling,
            do_sample=do_sample,
            max_new_tokens=max_new_tokens,
            eos_token_id=eos,
            pad_token_id=pad,
        )
    assert isinstance(output, torch.Tensor)
    num_correct = num_well_formed = 0
    for generated, row in zip(output[:, encoded["input_ids"].shape[1] :].tolist(), rows, strict=True):
        if eos not in generated:
            continue
        text = str(tokenizer.decode(generated[: generated.index(eos)]))
        num_well_formed += text.isdigit()
        num_correct += is_correct_answer(text, row["answer"])
    return AnswerAccuracy(num_correct / len(rows), num_well_formed / len(rows))


def ensure_arithmetic_policy(cache_dir: str | Path, recipe: WarmupRecipe = ARITHMETIC_RECIPE) -> Path:
    """Directory of the warmed-up demo policy (model + tokenizer): the package's shipped build of `recipe`
    (`shipped.py`), or for a recipe without one, its build under `cache_dir`, made on first use.

    Named `arithmetic-<fingerprint>`, so a changed recipe gets a fresh directory; `build_once` makes sure a
    crash never leaves a half-written model. `warmup.json` in it records the recipe, the build time and the
    validation accuracy measured right after the warm-up.
    """
    final = Path(cache_dir) / f"arithmetic-{arithmetic_fingerprint(recipe)}"
    announce = "the demo policy demo:arithmetic (supervised warm-up on addition)"
    return shipped_or_built(final, lambda staging: _build_arithmetic_policy(staging, recipe), announce)


def _build_arithmetic_policy(directory: Path, recipe: WarmupRecipe) -> None:
    started = time.perf_counter()
    tokenizer = build_tiny_tokenizer(recipe.spec.vocab_size)
    model = build_tiny_model(recipe.spec)
    # Training draws nothing from the global RNG today; forking keeps that true for callers if it changes.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(recipe.seed)
        final_loss = warm_up(model, tokenizer, recipe)
    seconds = time.perf_counter() - started
    _, validation = make_arithmetic_splits(recipe.num_validation, recipe.split_seed, recipe.max_operand)
    rows = [problem.row() for problem in validation]
    sampled = answer_accuracy(model, tokenizer, rows, do_sample=True)
    greedy = answer_accuracy(model, tokenizer, rows, do_sample=False)
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    report = {
        "recipe": asdict(recipe),
        "build_version": BUILD_VERSION,
        "warmup_seconds": round(seconds, 2),
        "final_loss": round(final_loss, 4),
        "validation_sampled": asdict(sampled),
        "validation_greedy": asdict(greedy),
    }
    (directory / "warmup.json").write_text(json.dumps(report, indent=2) + "\n")
