"""The multi-step tool demo's starting policy: the tiny model warmed up on noisy plays of (a + b) * c with tools.

Like `arithmetic_policy.py` for addition, but every demonstration is a whole conversation (`tool_task.py`) and
the loss covers only the assistant turns, tokenised as the policy server sees them. Half the plays hold a mistake,
so the policy samples a right play ~58% of the time (greedy 100%) and PPO has turn-level errors to fix.
`play_tool_task` measures that by playing in process (generate a turn, run the tools, splice the next prompt
as the policy server does). The trainer's model builder calls `ensure_tool_policy` (cached build).
Letters: B batch, S sequence.
"""

import hashlib
import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from transformers import GenerationMixin, PreTrainedModel, PreTrainedTokenizerBase

from asyncppo.demo.shipped import shipped_or_built
from asyncppo.demo.supervised_warmup import Batch, eos_and_pad, one_thread, supervised_warm_up
from asyncppo.demo.tool_task import (
    DEFAULT_MAX_ADDEND,
    DEFAULT_MAX_MULTIPLIER,
    DEFAULT_MIN_MULTIPLIER,
    DEMO_NUM_VALIDATION,
    DEMO_SPLIT_SEED,
    Demonstration,
    call_tool,
    is_well_formed_turn,
    make_demonstrations,
    make_tool_task_splits,
    parse_generation,
    reward,
)
from asyncppo.models.chat_template import IM_END, IM_START
from asyncppo.models.tiny import TINY, TinyModelSpec, build_tiny_model, build_tiny_tokenizer

# Bump when the warm-up procedure changes in a way the recipe does not capture, so caches rebuild.
BUILD_VERSION = 1
ASSISTANT_HEADER = f"{IM_START}assistant\n"


@dataclass(frozen=True)
class ToolWarmupRecipe:
    """Everything that determines the warm-up; hashed (with the data and BUILD_VERSION) into the cache name."""

    spec: TinyModelSpec = TINY
    max_addend: int = DEFAULT_MAX_ADDEND
    min_multiplier: int = DEFAULT_MIN_MULTIPLIER
    max_multiplier: int = DEFAULT_MAX_MULTIPLIER
    num_validation: int = DEMO_NUM_VALIDATION
    split_seed: int = DEMO_SPLIT_SEED
    wrong_fraction: float = 0.5
    num_steps: int = 1500
    batch_size: int = 8
    learning_rate: float = 3e-3
    warmup_steps: int = 20
    seed: int = 0


TOOL_TASK_RECIPE = ToolWarmupRecipe()


def warmup_demonstrations(recipe: ToolWarmupRecipe) -> list[Demonstration]:
    """The warm-up's plays, drawn from the train split only (validation problems are never shown)."""
    train, _ = make_tool_task_splits(
        recipe.num_validation, recipe.split_seed, recipe.max_addend, recipe.min_multiplier, recipe.max_multiplier
    )
    return make_demonstrations(train, recipe.num_steps * recipe.batch_size, recipe.wrong_fraction, recipe.seed)


def tool_policy_fingerprint(recipe: ToolWarmupRecipe) -> str:
    """Short hash of the recipe, the demonstrations it produces and BUILD_VERSION."""
    data = json.dumps([d.messages for d in warmup_demonstrations(recipe)], sort_keys=True)
    payload = json.dumps(
        {
            "recipe": asdict(recipe),
            "data_sha256": hashlib.sha256(data.encode()).hexdigest(),
            "build_version": BUILD_VERSION,
        },
        sort_keys=True,
    )
    return hashlib.sha256(payload.encode()).hexdigest()[:12]


def render(tokenizer: PreTrainedTokenizerBase, messages: list[dict[str, Any]], add_generation_prompt: bool) -> str:
    """The chat-template text of `messages` (no tools: the task's rows carry none)."""
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=add_generation_prompt)
    assert isinstance(text, str)
    return text


def conversation_tokens(
    tokenizer: PreTrainedTokenizerBase, messages: list[dict[str, Any]]
) -> tuple[list[int], list[bool]]:
    """(ids, assistant mask) of a whole conversation; the mask marks what the policy generates.

    The text is rendered once and tokenised once; each assistant turn spans from after `<|im_start|>assistant\\n`
    up to and including its `<|im_end|>` (the template's trailing "\\n" is never generated). Character offsets
    map the spans to tokens; rendering every prefix gives the same mask (a test checks) with 7 renders, not 1.
    """
    text = render(tokenizer, messages, add_generation_prompt=False)
    spans = []
    start = text.find(ASSISTANT_HEADER)
    while start != -1:
        begin = start + len(ASSISTANT_HEADER)
        end = text.index(IM_END, begin) + len(IM_END)
        spans.append((begin, end))
        start = text.find(ASSISTANT_HEADER, end)
    encoded = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    ids, offsets = list(encoded["input_ids"]), encoded["offset_mapping"]
    mask = [any(begin <= first and last <= end for begin, end in spans) for first, last in offsets]
    # A token straddling a span edge would make the mask ambiguous; special tokens bound every span.
    assert sum(last - first for (first, last), masked in zip(offsets, mask, strict=True) if masked) == sum(
        end - begin for begin, end in spans
    ), "a token crosses the edge of an assistant turn"
    return ids, mask


def conversation_batch(
    tokenizer: PreTrainedTokenizerBase, demonstrations: list[Demonstration]
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(input_ids, attention_mask, labels) [B, S], right-padded; labels are -100 except on assistant turns."""
    _, pad = eos_and_pad(tokenizer)
    sequences = [conversation_tokens(tokenizer, demonstration.messages) for demonstration in demonstrations]
    length = max(len(ids) for ids, _ in sequences)
    input_ids = torch.full((len(sequences), length), pad)
    labels = torch.full((len(sequences), length), -100)
    attention_mask = torch.zeros((len(sequences), length), dtype=torch.long)
    for row, (ids, mask) in enumerate(sequences):
        input_ids[row, : len(ids)] = torch.tensor(ids)
        labels[row, : len(ids)] = torch.where(torch.tensor(mask), torch.tensor(ids), -100)
        attention_mask[row, : len(ids)] = 1
    return input_ids, attention_mask, labels


def warm_up(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, recipe: ToolWarmupRecipe) -> float:
    """Supervised training on the recipe's plays (see supervised_warm_up).

    Returns the mean loss per assistant token over the last 10% of steps.
    """
    demonstrations = warmup_demonstrations(recipe)

    def batch_at(step: int) -> Batch:
        start = step * recipe.batch_size
        return conversation_batch(tokenizer, demonstrations[start : start + recipe.batch_size])

    return supervised_warm_up(
        model,
        batch_at,
        num_steps=recipe.num_steps,
        learning_rate=recipe.learning_rate,
        warmup_steps=recipe.warmup_steps,
    )


@dataclass
class ToolTaskPlay:
    """One conversation being played: its messages, the next turn's prompt ids and what its turns scored."""

    messages: list[dict[str, Any]]
    prompt: list[int]
    expected_answer: str
    final_text: str = ""
    num_turns: int = 0
    num_well_formed: int = 0
    done: bool = False

    @classmethod
    def start(cls, tokenizer: PreTrainedTokenizerBase, row: dict[str, Any]) -> "ToolTaskPlay":
        """The play of a gym row, before its first turn."""
        messages = [dict(message) for message in row["responses_create_params"]["input"]]
        prompt = tokenizer.encode(render(tokenizer, messages, add_generation_prompt=True), add_special_tokens=False)
        return cls(messages, prompt, str(row["expected_answer"]))

    @property
    def reward(self) -> float:
        return reward(self.final_text, self.expected_answer)

    def advance(self, tokenizer: PreTrainedTokenizerBase, generated: list[int], last_turn: bool) -> None:
        """Takes one turn's generated ids (anything after its eos is ignored); runs its calls or ends the play.

        The next prompt is gym/chat_prompt.build_prompt's splice: the exact ids so far, eos included, then the
        template's rendering of everything after this turn's eos (the tool messages, the generation prompt).
        """
        eos, _ = eos_and_pad(tokenizer)
        ended = eos in generated
        ids = generated[: generated.index(eos) + 1] if ended else generated
        content, calls = parse_generation(str(tokenizer.decode(ids[:-1] if ended else ids)))
        self.num_turns += 1
        self.num_well_formed += ended and is_well_formed_turn(content, calls)
        # Verify reads the last assistant message item, and the agent makes one only for a turn with text or
        # without calls.
        if content or not calls:
            self.final_text = content
        if not ended or not calls or last_turn:
            self.done = True
            return
        tool_calls, tool_messages = [], []
        for index, call in enumerate(calls):
            # Arguments as the policy server re-serializes them (chat_prompt._parse_call).
            arguments = (
                call.arguments if isinstance(call.arguments, str) else json.dumps(call.arguments, ensure_ascii=False)
            )
            tool_calls.append(
                {"id": f"call_{index}", "type": "function", "function": {"name": call.name, "arguments": arguments}}
            )
            tool_messages.append({"role": "tool", "tool_call_id": f"call_{index}", "content": call_tool(call)})
        self.messages += [{"role": "assistant", "content": content, "tool_calls": tool_calls}, *tool_messages]
        prefix = self.prompt + ids
        full = tokenizer.encode(render(tokenizer, self.messages, add_generation_prompt=True), add_special_tokens=False)
        eos_positions = [position for position, token in enumerate(full) if token == eos]
        self.prompt = prefix[:-1] + full[eos_positions[prefix.count(eos) - 1] :]


@dataclass(frozen=True)
class ToolTaskScore:
    """Mean reward, share of well-formed assistant turns (each ended by eos) and assistant turns per play."""

    success: float
    well_formed: float
    mean_turns: float


@torch.no_grad()
def play_tool_task(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    rows: list[dict[str, Any]],
    do_sample: bool,
    seed: int = 0,
    max_turns: int = 4,
    max_new_tokens: int = 48,
) -> ToolTaskScore:
    """Plays every gym row to the end, sampling at temperature 1 (top_k 0, top_p 1) or greedy.

    Each turn generates for all unfinished plays at once. A turn with calls gets the tool messages and the
    next prompt is the policy server's splice (the turn's exact ids, then the template from its eos on); a turn
    without calls, one cut off by max_new_tokens, or the max_turns-th ends the play. The final text (of the
    last turn that wrote any) earns `reward`. generate() is fine here: no logprob feeds training.
    """
    plays = [ToolTaskPlay.start(tokenizer, row) for row in rows]
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        for turn in range(max_turns):
            active = [play for play in plays if not play.done]
            if not active:
                break
            generations = _generate(model, tokenizer, [play.prompt for play in active], do_sample, max_new_tokens)
            for play, generated in zip(active, generations, strict=True):
                play.advance(tokenizer, generated, last_turn=turn == max_turns - 1)
    num_turns = sum(play.num_turns for play in plays)
    return ToolTaskScore(
        success=sum(play.reward for play in plays) / len(plays),
        well_formed=sum(play.num_well_formed for play in plays) / num_turns,
        mean_turns=num_turns / len(plays),
    )


def _generate(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    prompts: list[list[int]],
    do_sample: bool,
    max_new_tokens: int,
) -> list[list[int]]:
    """The generated ids of each prompt (left-padded into one batch; pads after eos included)."""
    eos, pad = eos_and_pad(tokenizer)
    # PreTrainedModel itself has no generate() in transformers 5; causal LM classes mix it in.
    assert isinstance(model, GenerationMixin), f"{type(model).__name__} cannot generate"
    length = max(len(prompt) for prompt in prompts)
    input_ids = torch.tensor([[pad] * (length - len(prompt)) + prompt for prompt in prompts])
    attention_mask = torch.tensor([[0] * (length - len(prompt)) + [1] * len(prompt) for prompt in prompts])
    sampling: dict[str, Any] = {"top_k": 0, "top_p": 1.0, "temperature": 1.0} if do_sample else {}
    # generate()'s self-type protocol (GenerativePreTrainedModel) does not match transformers' own classes.
    output = model.generate(  # pyright: ignore[reportAttributeAccessIssue]
        input_ids=input_ids,
        attention_mask=attention_mask,
        **sampling,
        do_sample=do_sample,
        max_new_tokens=max_new_tokens,
        eos_token_id=eos,
        pad_token_id=pad,
    )
    assert isinstance(output, torch.Tensor)
    return output[:, length:].tolist()


def ensure_tool_policy(cache_dir: str | Path, recipe: ToolWarmupRecipe = TOOL_TASK_RECIPE) -> Path:
    """Directory of the warmed-up multi-step tool policy (model + tokenizer): the package's shipped build of
    `recipe` (`shipped.py`), or for a recipe without one, its build under `cache_dir`, made on first use.

    Named `multi_step-<fingerprint>`; `build_once` makes sure a crash never leaves a half-written model.
    `warmup.json` in it records the recipe, the build time, the final loss and the validation scores.
    """
    final = Path(cache_dir) / f"multi_step-{tool_policy_fingerprint(recipe)}"
    announce = "the demo policy demo:multi_step (supervised warm-up on tool calls)"
    return shipped_or_built(final, lambda staging: _build_tool_policy(staging, recipe), announce)


def _build_tool_policy(directory: Path, recipe: ToolWarmupRecipe) -> None:
    started = time.perf_counter()
    tokenizer = build_tiny_tokenizer(recipe.spec.vocab_size)
    model = build_tiny_model(recipe.spec)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(recipe.seed)
        final_loss = warm_up(model, tokenizer, recipe)
    seconds = time.perf_counter() - started
    _, validation = make_tool_task_splits(
        recipe.num_validation, recipe.split_seed, recipe.max_addend, recipe.min_multiplier, recipe.max_multiplier
    )
    rows = [problem.row() for problem in validation]
    with one_thread():
        sampled = play_tool_task(model, tokenizer, rows, do_sample=True)
        greedy = play_tool_task(model, tokenizer, rows, do_sample=False)
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
