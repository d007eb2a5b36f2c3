"""Turn one gym `/run` result into a token-exact Trajectory; called by `gym/client.py`.

Contract: docs/gym-protocol.md, From result to trajectory.

A result's `response.output` lists the items of the rollout in order. Every item with a non-empty
`generation_token_ids` is one model call (one turn k). Its `prompt_token_ids` must start with the history
so far (all earlier prompts and generations); the tokens beyond it are the turn's observation (loss mask 0)
and its generation follows (loss mask 1, with its logprobs):

    history:  [ prompt_0 | gen_0 | delta_1 | gen_1 | ... | delta_K-1 | gen_K-1 ]
    roles:       user    asst   tool/user  asst          tool/user    asst

A result that cannot become a trajectory (malformed, mistyped or missing fields, a non-finite reward or logprob)
raises InvalidResultError naming the agent, the prompt group and sample, and the field: the runner then counts
the group as failed and the batch source replaces it, instead of a NaN reaching the advantages.
"""

import json
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from asyncppo.gym.protocol import TokenFields
from asyncppo.types import MessageSpan, Role, Trajectory

# Row fields that steer the rollout rather than describe the task; they stay out of `Trajectory.task`.
NON_TASK_FIELDS = frozenset({"responses_create_params", "agent_ref"})
# How much of an unusable result an error message quotes.
QUOTE_CHARS = 200
# How much of the row an error message quotes to name it.
ROW_QUOTE_CHARS = 120
# Tolerance of the check that the named reward components add up to the reward.
REWARD_SUM_TOLERANCE = 1e-6


class InvalidResultError(ValueError):
    """A `/run` result that cannot become a trajectory; the message names the agent, the row and the field."""


@dataclass(frozen=True)
class StepLimit:
    """An agent's cap on one rollout (`max_steps` in its config): model calls, or tool calls when
    `counts_tool_calls` (NeMo-Gym simple_agent's `count_tool_calls`)."""

    max_steps: int
    counts_tool_calls: bool = False


def quote(value: object, num_chars: int = QUOTE_CHARS) -> str:
    """The first `num_chars` characters of `value` as JSON (or repr), for error messages."""
    try:
        text = value if isinstance(value, str) else json.dumps(value, default=repr)
    except (TypeError, ValueError):
        text = repr(value)
    return text if len(text) <= num_chars else text[:num_chars] + "..."


def trajectory_from_result(
    result: object,
    *,
    row: Mapping[str, Any],
    group_id: int,
    sample_index: int,
    policy_version: int,
    step_limit: StepLimit | None = None,
) -> Trajectory:
    """Convert one `/run` result; `row` is the caller's own copy of the dataset row (results need not echo it).

    `step_limit` is the agent's, when known: a rollout it cut is truncated although the agent reports it completed.

    Raises InvalidResultError (a ValueError) when the result has no model call with generated tokens (the agent
    died before its first model request, or the first prompt overflowed the context), when a turn's prompt does
    not start with the history so far (re-tokenisation drift, docs/gym-protocol.md, Multi-turn token exactness),
    or when a field is missing, mistyped or not finite.
    """
    try:
        if not isinstance(result, Mapping):
            raise ValueError(f"gym result is not a JSON object: {quote(result)}")
        return _convert(result, row, group_id, sample_index, policy_version, step_limit)
    except ValueError as error:
        raise InvalidResultError(f"{_origin(row, group_id, sample_index)}: {error}") from error


def _origin(row: Mapping[str, Any], group_id: int, sample_index: int) -> str:
    """Which agent and which row a result came from, for error messages."""
    agent_ref = row.get("agent_ref")
    name = agent_ref.get("name") if isinstance(agent_ref, Mapping) else None
    agent = f"agent {name!r}" if isinstance(name, str) else "the default agent (the row has no agent_ref.name)"
    task = {key: value for key, value in row.items() if key not in NON_TASK_FIELDS}
    return f"{agent}, prompt group {group_id} sample {sample_index} (row {quote(task, ROW_QUOTE_CHARS)})"


def _convert(
    result: Mapping[str, Any],
    row: Mapping[str, Any],
    group_id: int,
    sample_index: int,
    policy_version: int,
    step_limit: StepLimit | None,
) -> Trajectory:
    response = _response(result)
    token_ids: list[int] = []
    loss_mask: list[int] = []
    logprobs: list[float] = []
    message_log: list[MessageSpan] = []
    prompt_length = 0
    last_generation: list[int] = []
    saw_tool_output = False
    turn = 0
    for item in response["output"]:
        if not isinstance(item, Mapping):
            raise ValueError(f"gym result: output item is not an object: {quote(item)}")
        if item.get("type") == "function_call_output":
            saw_tool_output = True
        if item.get("generation_token_ids") in (None, []):
            continue  # tool outputs, token-less reasoning, empty generations: nothing the policy sampled
        prompt, generated, generated_logprobs = _token_fields(item, turn)
        delta = _observation(token_ids, prompt, turn)
        if turn == 0:
            prompt_length = len(delta)
        if delta:
            role: Role = "tool" if saw_tool_output else "user"
            _append(token_ids, loss_mask, logprobs, message_log, role, delta, [0.0] * len(delta), mask=0)
        _append(token_ids, loss_mask, logprobs, message_log, "assistant", generated, generated_logprobs, 1)
        last_generation = generated
        saw_tool_output = False
        turn += 1
    if turn == 0:
        raise ValueError(
            "gym result has no model call with generated tokens: the agent likely failed before its first model "
            "request, or the first prompt already exceeded the context; check the agent's and environment's logs. "
            f"Result starts: {quote(result)}"
        )
    reward = _number(result.get("reward"), "reward")
    return Trajectory(
        token_ids=token_ids,
        loss_mask=loss_mask,
        generation_logprobs=logprobs,
        prompt_length=prompt_length,
        message_log=message_log,
        reward=reward,
        group_id=group_id,
        sample_index=sample_index,
        policy_version=policy_version,
        last_policy_version=policy_version,
        truncated=_is_truncated(result, row, response, last_generation)
        or _cut_by_step_limit(response["output"], turn, step_limit),
        mask_sample=_mask_sample(result),
        reward_components=_reward_components(result, reward),
        task={key: value for key, value in row.items() if key not in NON_TASK_FIELDS},
    )


def _response(result: Mapping[str, Any]) -> Mapping[str, Any]:
    """The result's `response`, checked to hold an `output` list (the rollout's items)."""
    response = result.get("response")
    if not isinstance(response, Mapping) or not isinstance(response.get("output"), list):
        raise ValueError(f"gym result has no response.output list; result starts: {quote(result)}")
    return response


def _token_fields(item: Mapping[str, Any], turn: int) -> tuple[list[int], list[int], list[float]]:
    """The item's (prompt_token_ids, generation_token_ids, generation_log_probs), typed strictly ("1" is not a
    token id), ids >= 0 and logprobs finite."""
    try:
        fields = TokenFields.model_validate(item, strict=True)
    except ValidationError as error:
        first = error.errors()[0]
        where = ".".join(str(part) for part in first["loc"]) or "the item"
        raise ValueError(
            f"gym result: turn {turn}: {where}: {first['msg']} ({error.error_count()} problem(s)); "
            f"got {quote(first.get('input'), 80)}"
        ) from None
    for key in ("prompt_token_ids", "generation_token_ids"):
        ids: list[int] = getattr(fields, key)
        if any(token < 0 for token in ids):
            raise ValueError(f"gym result: turn {turn}: {key} holds a negative token id: {quote(ids, 80)}")
    prompt, generated, logprobs = fields.prompt_token_ids, fields.generation_token_ids, fields.generation_log_probs
    assert prompt is not None and generated is not None and logprobs is not None, "validated together"
    bad = next((value for value in logprobs if not math.isfinite(value)), None)
    if bad is not None:
        raise ValueError(f"gym result: turn {turn}: generation_log_probs holds {bad}, expected finite numbers")
    return prompt, generated, logprobs


def _observation(history: list[int], prompt: list[int], turn: int) -> list[int]:
    """The tokens turn `turn`'s prompt adds after the history so far (its observation); ValueError when the prompt
    does not continue the history, or when turn 0's is empty."""
    mismatch = _first_mismatch(history, prompt)
    if mismatch is not None:
        raise ValueError(
            f"gym result: turn {turn} is not contiguous with the history: its prompt_token_ids "
            f"(length {len(prompt)}) differ from the {len(history)} history tokens at position {mismatch} "
            "(re-tokenisation drift; the policy server must splice required_prefix_token_ids)"
        )
    delta = prompt[len(history) :]
    if turn == 0 and not delta:
        raise ValueError("gym result: turn 0 has an empty prompt_token_ids")
    return delta


def _first_mismatch(history: list[int], prompt: list[int]) -> int | None:
    """First position where `prompt` fails to continue `history` (len(prompt) when it is too short), else None."""
    for position, token in enumerate(history):
        if position >= len(prompt) or prompt[position] != token:
            return position
    return None


def _append(
    token_ids: list[int],
    loss_mask: list[int],
    logprobs: list[float],
    message_log: list[MessageSpan],
    role: Role,
    tokens: list[int],
    token_logprobs: list[float],
    mask: int,
) -> None:
    token_ids.extend(tokens)
    loss_mask.extend([mask] * len(tokens))
    logprobs.extend(token_logprobs)
    message_log.append(MessageSpan(role=role, num_tokens=len(tokens)))


def _number(value: object, key: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"gym result: `{key}` must be a number, got {quote(value)}")
    try:
        number = float(value)
    except OverflowError:  # an int past float's range
        number = math.inf
    if not math.isfinite(number):
        raise ValueError(f"gym result: `{key}` is {quote(value, 40)}, expected a finite number")
    return number


def _is_truncated(
    result: Mapping[str, Any], row: Mapping[str, Any], response: Mapping[str, Any], last_generation: list[int]
) -> bool:
    """The rollout ended on a length stop: the response says so, or the last generation used its whole budget."""
    if response.get("incomplete_details") or response.get("status") == "incomplete":
        return True
    for source in (result, row):
        params = source.get("responses_create_params")
        limit = params.get("max_output_tokens") if isinstance(params, Mapping) else None
        if isinstance(limit, int) and not isinstance(limit, bool) and limit > 0:
            return len(last_generation) >= limit
    return False


def _cut_by_step_limit(output: Sequence[object], num_model_calls: int, step_limit: StepLimit | None) -> bool:
    """The agent stopped at its step limit with a tool call the model never saw answered: the rollout ends on a
    tool call or its output, not on a final answer, after `max_steps` steps (an agent that stops at the limit
    reports the response `completed`, so nothing else in the result tells)."""
    if step_limit is None or not output:
        return False
    last = output[-1]
    if not isinstance(last, Mapping) or last.get("type") not in ("function_call", "function_call_output"):
        return False
    if step_limit.counts_tool_calls:
        steps = sum(1 for item in output if isinstance(item, Mapping) and item.get("type") == "function_call")
    else:
        steps = num_model_calls
    return steps >= step_limit.max_steps


def _mask_sample(result: Mapping[str, Any]) -> bool:
    """`instance_config.mask_sample`: the environment asks to keep the sample for baselines but not the loss."""
    instance_config = result.get("instance_config")
    if not isinstance(instance_config, Mapping):
        return False
    mask_sample = instance_config.get("mask_sample", False)
    if not isinstance(mask_sample, bool):
        raise ValueError(f"gym result: `instance_config.mask_sample` must be true or false, got {quote(mask_sample)}")
    return mask_sample


def _reward_components(result: Mapping[str, Any], reward: float) -> dict[str, float]:
    components = result.get("reward_components")
    if components is None:
        return {}
    if not isinstance(components, Mapping):
        raise ValueError(f"gym result: `reward_components` must be an object, got {quote(components)}")
    parts = {str(name): _number(value, f"reward_components.{name}") for name, value in components.items()}
    total = sum(parts.values())
    if parts and abs(total - reward) > REWARD_SUM_TOLERANCE * max(1.0, abs(reward)):
        raise ValueError(f"gym result: reward_components {parts} sum to {total} but reward is {reward}")
    return parts


def assistant_texts(result: Mapping[str, Any]) -> list[str]:
    """The text of every assistant `message` item of `response.output` (output_text parts joined; tool calls,
    which are `function_call` items, are not text)."""
    response = result.get("response")
    output = response.get("output") if isinstance(response, Mapping) else None
    texts: list[str] = []
    for item in output if isinstance(output, list) else []:
        if not isinstance(item, Mapping) or item.get("type") != "message" or item.get("role") != "assistant":
            continue
        content = item.get("content")
        if isinstance(content, str):
            texts.append(content)
        elif isinstance(content, list):
            parts = [part.get("text") for part in content if isinstance(part, Mapping)]
            texts.append("".join(part for part in parts if isinstance(part, str)))
    return texts


def has_invalid_tool_call(result: Mapping[str, Any], patterns: Sequence[re.Pattern[str]]) -> bool:
    """Whether any pattern occurs (`search`) in the text of an assistant message: tool-call markup left in the
    text is a call the agent's parser did not turn into a `function_call`, so it was never executed."""
    return any(pattern.search(text) for text in assistant_texts(result) for pattern in patterns)
