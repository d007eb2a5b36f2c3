"""Single-turn rollouts: chat-render each dataset row, sample G answers per prompt, score them, build Trajectories.

Called by the sync batch source and the async collector (one call per prompt group or per step), through the
trainer's rollout functions (`trainer/run_inputs.py`), which take one outcome per prompt group: a group whose
reward function fails is answered with its RewardFunctionError, to be replaced within the run's failure budget.

    rows --chat template--> prompt ids --Generator (G x rows requests at once)--> results --reward_fn--> Trajectories
         --max_new_tokens_key (optional)--> each request's own token budget
"""

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any, cast, get_args

from transformers import PreTrainedTokenizerBase

from asyncppo.data.prompt_files import fill_prompt_template
from asyncppo.data.response_budgets import row_token_budgets
from asyncppo.generation.protocol import GenerationRequest, GenerationResult, SamplingParams, SupportsGenerate
from asyncppo.rollout.rewards import RewardFunction, RewardFunctionError, checked_reward
from asyncppo.types import MessageSpan, Role, Trajectory

ROLES: tuple[str, ...] = get_args(Role)


def prompt_messages(
    row: Mapping[str, Any],
    row_index: int,
    *,
    system_prompt: str | None,
    prompt_key: str,
    messages_key: str,
    prompt_template: str | None = None,
) -> list[dict[str, Any]]:
    """The row's `messages_key` list as is, else [system_prompt (if any), user: row[prompt_key] placed in the `{}`
    of `prompt_template` (if any)]."""
    if messages_key in row:
        messages = row[messages_key]
        if not isinstance(messages, list) or not messages:
            raise ValueError(f"row {row_index}: {messages_key!r} must be a non-empty list of messages")
        return cast(list[dict[str, Any]], messages)
    if prompt_key not in row:
        raise ValueError(f"row {row_index} has neither {messages_key!r} nor {prompt_key!r}; its keys are {sorted(row)}")
    system = [{"role": "system", "content": system_prompt}] if system_prompt else []
    text = str(row[prompt_key])
    content = fill_prompt_template(prompt_template, text) if prompt_template is not None else text
    return [*system, {"role": "user", "content": content}]


def _render(
    tokenizer: PreTrainedTokenizerBase, messages: list[dict[str, Any]], add_generation_prompt: bool
) -> list[int]:
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=add_generation_prompt)
    assert isinstance(text, str), "tokenize=False renders text"
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])  # pyright: ignore[reportArgumentType]


def render_prompt(
    tokenizer: PreTrainedTokenizerBase, messages: list[dict[str, Any]]
) -> tuple[list[int], list[MessageSpan]]:
    """Prompt token ids (chat template, add_generation_prompt=True) and one span per message covering them.

    Spans come from rendering the prefixes messages[:1], messages[:2], ... and taking the growth in tokens;
    the generation prompt (e.g. `<|im_start|>assistant\\n`) joins the last message's span, so an assistant
    span holds exactly the generated tokens. When a rendered prefix is not a token prefix of the next
    rendering (templates that rewrite earlier turns, BPE merges across a boundary) or a role is not a
    Trajectory role, the whole prompt becomes a single `user` span instead.
    """
    prompt_ids = _render(tokenizer, messages, add_generation_prompt=True)
    spans: list[MessageSpan] = []
    previous: list[int] = []
    for count, message in enumerate(messages, start=1):
        rendered = prompt_ids if count == len(messages) else _render(tokenizer, messages[:count], False)
        role = message.get("role")
        if rendered[: len(previous)] != previous or role not in ROLES:
            return prompt_ids, [MessageSpan("user", len(prompt_ids))]
        spans.append(MessageSpan(cast(Role, role), len(rendered) - len(previous)))
        previous = rendered
    return prompt_ids, spans


GroupOutcome = list[Trajectory] | Exception
"""One prompt group's Trajectories, or the error that failed it (as pipeline/sources.py's GroupOutcome)."""


class UnscoredGroupError(RuntimeError):
    """A prompt group left unscored because more groups of its call had failed than the caller allows."""


def run_single_turn_rollouts(
    generator: SupportsGenerate,
    tokenizer: PreTrainedTokenizerBase,
    rows: Sequence[Mapping[str, Any]],
    *,
    num_generations_per_prompt: int,
    sampling: SamplingParams,
    reward_fn: RewardFunction,
    group_id_start: int,
    system_prompt: str | None,
    prompt_key: str,
    messages_key: str,
    max_prompt_tokens: int,
    max_new_tokens_key: str | None = None,
    prompt_template: str | None = None,
    reward_timeout_s: float | None = None,
) -> list[Trajectory]:
    """Every group of `run_single_turn_groups` (same arguments), flattened in row-major order; the first group's
    failure (a RewardFunctionError) is raised instead."""
    outcomes = run_single_turn_groups(
        generator,
        tokenizer,
        rows,
        num_generations_per_prompt=num_generations_per_prompt,
        sampling=sampling,
        reward_fn=reward_fn,
        group_id_start=group_id_start,
        system_prompt=system_prompt,
        prompt_key=prompt_key,
        messages_key=messages_key,
        max_prompt_tokens=max_prompt_tokens,
        max_new_tokens_key=max_new_tokens_key,
        prompt_template=prompt_template,
        reward_timeout_s=reward_timeout_s,
        max_failed_groups=0,
    )
    trajectories: list[Trajectory] = []
    for outcome in outcomes:
        if isinstance(outcome, Exception):
            raise outcome
        trajectories.extend(outcome)
    return trajectories


def run_single_turn_groups(
    generator: SupportsGenerate,
    tokenizer: PreTrainedTokenizerBase,
    rows: Sequence[Mapping[str, Any]],
    *,
    num_generations_per_prompt: int,
    sampling: SamplingParams,
    reward_fn: RewardFunction,
    group_id_start: int,
    system_prompt: str | None,
    prompt_key: str,
    messages_key: str,
    max_prompt_tokens: int,
    max_new_tokens_key: str | None = None,
    prompt_template: str | None = None,
    reward_timeout_s: float | None = None,
    max_failed_groups: int | None = None,
) -> list[GroupOutcome]:
    """One outcome per row, in order: its G = num_generations_per_prompt Trajectories, or the error that failed it.

    Row i gets group_id = group_id_start + i. Every prompt is rendered and length-checked (and its response
    budgets read) before anything is submitted; then all requests go to the generator in one `generate` call so
    they can share batches (a prompt or generation error raises: it fails the whole call). With `max_new_tokens_key`,
    sample j of row i generates at most min(row_token_budgets(...)[j], sampling.max_new_tokens) tokens. The reward
    is reward_fn(response text decoded without special tokens, row), through `checked_reward` with the deadline
    `reward_timeout_s`; task = the row minus the prompt/messages field (a budget field stays in it).
    Plain-text prompts get `system_prompt` and `prompt_template` (`prompt_messages`); the row the reward function
    sees keeps the prompt as the data holds it.

    A group's first failing reward (RewardFunctionError) is its outcome, and its later samples are not scored. Once
    more than `max_failed_groups` (None: no limit) groups have failed, the rows after are answered with
    UnscoredGroupError without calling the function: a function that hangs would cost a deadline per row when the
    caller stops at the first failure beyond its budget anyway.
    """
    if num_generations_per_prompt < 1:
        raise ValueError(f"num_generations_per_prompt must be >= 1, got {num_generations_per_prompt}")
    rendered = []
    budgets: list[int] = []
    for index, row in enumerate(rows):
        messages = prompt_messages(
            row,
            index,
            system_prompt=system_prompt,
            prompt_key=prompt_key,
            messages_key=messages_key,
            prompt_template=prompt_template,
        )
        rendered.append(_checked_prompt(tokenizer, messages, index, max_prompt_tokens))
        where = f"row {index} (prompt group {group_id_start + index})"
        budgets.extend(_sample_budgets(row, where, max_new_tokens_key, num_generations_per_prompt, sampling))

    # One generate call queues every request together, so the engine can decode them in shared batches.
    prompts = [prompt_ids for prompt_ids, _ in rendered for _ in range(num_generations_per_prompt)]
    results = generator.generate(
        [
            GenerationRequest(tuple(prompt_ids), _with_budget(sampling, budget))
            for prompt_ids, budget in zip(prompts, budgets, strict=True)
        ]
    )

    outcomes: list[GroupOutcome] = []
    num_failed = 0
    for index, (row, (prompt_ids, spans)) in enumerate(zip(rows, rendered, strict=True)):
        group_id = group_id_start + index
        if max_failed_groups is not None and num_failed > max_failed_groups:
            outcomes.append(UnscoredGroupError(f"prompt group {group_id} was not scored: {num_failed} groups failed"))
            continue
        task = {key: value for key, value in row.items() if key not in (prompt_key, messages_key)}
        group: list[Trajectory] = []
        for sample_index in range(num_generations_per_prompt):
            result = results[index * num_generations_per_prompt + sample_index]
            response_text = tokenizer.decode(list(result.token_ids), skip_special_tokens=True)
            assert isinstance(response_text, str), "decoding one sequence gives one string"
            where = f"row {index} (prompt group {group_id}, sample {sample_index})"
            try:
                reward = checked_reward(reward_fn, response_text, row, where, reward_timeout_s)
            except RewardFunctionError as error:  # fault tolerance is the point: the caller counts or raises it
                outcomes.append(error)
                num_failed += 1
                break
            group.append(_trajectory(prompt_ids, spans, result, reward, task, group_id, sample_index))
        else:
            outcomes.append(group)
    return outcomes


def _checked_prompt(
    tokenizer: PreTrainedTokenizerBase, messages: list[dict[str, Any]], index: int, max_prompt_tokens: int
) -> tuple[list[int], list[MessageSpan]]:
    """`render_prompt` of row `index`; ValueError naming the row when the prompt is over max_prompt_tokens."""
    prompt_ids, spans = render_prompt(tokenizer, messages)
    if len(prompt_ids) > max_prompt_tokens:
        raise ValueError(
            f"row {index}: the prompt has {len(prompt_ids)} tokens, over max_prompt_tokens={max_prompt_tokens}"
        )
    return prompt_ids, spans


def _sample_budgets(
    row: Mapping[str, Any], where: str, key: str | None, num_generations: int, sampling: SamplingParams
) -> list[int]:
    """Each of the row's samples' token budget: sampling.max_new_tokens, capped by the row's own budgets when
    `key` names their field (`row_token_budgets`)."""
    if key is None:
        return [sampling.max_new_tokens] * num_generations
    return [min(budget, sampling.max_new_tokens) for budget in row_token_budgets(row, where, key, num_generations)]


def _with_budget(sampling: SamplingParams, max_new_tokens: int) -> SamplingParams:
    # Shared params object when the budget is the profile's: most requests of most runs.
    if max_new_tokens == sampling.max_new_tokens:
        return sampling
    return dataclasses.replace(sampling, max_new_tokens=max_new_tokens)


def _trajectory(
    prompt_ids: list[int],
    spans: list[MessageSpan],
    result: GenerationResult,
    reward: float,
    task: dict[str, Any],
    group_id: int,
    sample_index: int,
) -> Trajectory:
    num_generated = len(result.token_ids)
    return Trajectory(
        token_ids=prompt_ids + list(result.token_ids),
        loss_mask=[0] * len(prompt_ids) + [1] * num_generated,
        generation_logprobs=[0.0] * len(prompt_ids) + list(result.logprobs),
        prompt_length=len(prompt_ids),
        message_log=[*spans, MessageSpan("assistant", num_generated)],
        reward=reward,
        group_id=group_id,
        sample_index=sample_index,
        policy_version=result.policy_version,
        last_policy_version=result.last_policy_version,
        truncated=result.finish_reason == "length",
        task=task,
    )
