"""Gym `/run` result -> Trajectory (gym/results.py), on fixtures shaped like docs/gym-protocol.md, sections Agent
server and From result to trajectory.

The two-turn fixture: turn 0 prompt [1 2 3 4] generates the tool call [5 6 7]; the tool output and the next
assistant header are [8 9]; turn 1 prompt [1..9] generates [10 11]. So the history is 1..11 and the loss
mask is 1 exactly on 5 6 7 10 11.
"""

import copy
import json
import math
import re
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from asyncppo.gym.results import (
    InvalidResultError,
    StepLimit,
    assistant_texts,
    has_invalid_tool_call,
    trajectory_from_result,
)
from asyncppo.types import MessageSpan

FIXTURES = Path(__file__).parent / "fixtures"
ROW = {
    "responses_create_params": {"input": [{"role": "user", "content": "What is the value of the synonym Blazing?"}]},
    "agent_ref": {"type": "responses_api_agents", "name": "synonym_agent"},
    "expected_answer": "711",
    "_rowidx": 3,
}


def load(name: str) -> dict[str, Any]:
    return json.loads((FIXTURES / name).read_text())


def convert(result: dict[str, Any]):
    return trajectory_from_result(result, row=ROW, group_id=7, sample_index=2, policy_version=5)


def test_two_turn_tool_call_keeps_the_history_token_exact() -> None:
    trajectory = convert(load("run_result_two_turn_tool_call.json"))
    assert trajectory.token_ids == list(range(1, 12))
    assert trajectory.prompt_length == 4
    assert trajectory.message_log == [
        MessageSpan("user", 4),
        MessageSpan("assistant", 3),
        MessageSpan("tool", 2),
        MessageSpan("assistant", 2),
    ]
    assert (trajectory.group_id, trajectory.sample_index) == (7, 2)
    assert trajectory.policy_version == trajectory.last_policy_version == 5


def test_loss_mask_is_one_only_on_generated_tokens_with_their_logprobs() -> None:
    trajectory = convert(load("run_result_two_turn_tool_call.json"))
    assert trajectory.loss_mask == [0, 0, 0, 0, 1, 1, 1, 0, 0, 1, 1]
    assert trajectory.generation_logprobs == [0.0] * 4 + [-0.1, -0.2, -0.3, 0.0, 0.0, -0.4, -0.5]
    assert trajectory.num_generated_tokens == 5


def test_reward_components_and_flags_come_from_the_result() -> None:
    trajectory = convert(load("run_result_two_turn_tool_call.json"))
    assert trajectory.reward == 1.0
    assert trajectory.reward_components == {"correct": 0.75, "format": 0.25}
    assert trajectory.mask_sample is False
    # 2 generated tokens in the last turn, budget 16: a natural stop.
    assert trajectory.truncated is False
    assert trajectory.task == {"expected_answer": "711", "_rowidx": 3}


def test_mask_sample_is_read_from_the_instance_config() -> None:
    result = load("run_result_two_turn_tool_call.json")
    result["instance_config"]["mask_sample"] = True
    assert convert(result).mask_sample is True
    del result["instance_config"]
    assert convert(result).mask_sample is False


def test_reward_components_that_do_not_sum_to_the_reward_raise() -> None:
    result = load("run_result_two_turn_tool_call.json")
    result["reward_components"]["format"] = 0.5
    with pytest.raises(ValueError, match=r"sum to 1\.25 but reward is 1\.0"):
        convert(result)


def test_last_generation_using_its_whole_budget_is_truncated() -> None:
    result = load("run_result_two_turn_tool_call.json")
    result["responses_create_params"]["max_output_tokens"] = 2
    assert convert(result).truncated is True
    incomplete = load("run_result_two_turn_tool_call.json")
    incomplete["response"]["incomplete_details"] = {"reason": "max_output_tokens"}
    assert convert(incomplete).truncated is True


def test_non_contiguous_history_names_the_turn_and_first_mismatch() -> None:
    result = load("run_result_two_turn_tool_call.json")
    # Re-tokenisation drift: turn 1's prompt re-encodes the generated 6 as 60.
    result["response"]["output"][3]["prompt_token_ids"] = [1, 2, 3, 4, 5, 60, 7, 8, 9]
    with pytest.raises(ValueError, match=r"turn 1 is not contiguous.* at position 5"):
        convert(result)


def test_prompt_shorter_than_the_history_is_not_contiguous() -> None:
    result = load("run_result_two_turn_tool_call.json")
    result["response"]["output"][3]["prompt_token_ids"] = [1, 2, 3, 4, 5]
    with pytest.raises(ValueError, match=r"turn 1 is not contiguous.* at position 5"):
        convert(result)


def test_result_without_a_model_call_raises_quoting_the_result() -> None:
    result = load("run_result_agent_died.json")
    with pytest.raises(ValueError, match="failed before its first model request") as raised:
        convert(result)
    assert json.dumps(result)[:150] in str(raised.value)


def test_items_with_empty_generations_are_skipped() -> None:
    result = load("run_result_two_turn_tool_call.json")
    empty = copy.deepcopy(result["response"]["output"][1])
    empty.update(prompt_token_ids=[1, 2, 3, 4, 5, 6, 7], generation_token_ids=[], generation_log_probs=[])
    result["response"]["output"].insert(2, empty)
    assert convert(result).token_ids == list(range(1, 12))


# Python's json reads NaN, Infinity and 1e309 (inf) as floats, so an agent's body can carry each of them.
@pytest.mark.parametrize("literal", ["NaN", "1e309", "-Infinity", "1" + "0" * 400])
def test_a_non_finite_reward_is_an_invalid_result_naming_agent_row_and_value(literal: str) -> None:
    text = (FIXTURES / "run_result_two_turn_tool_call.json").read_text()
    result = json.loads(text.replace('"reward": 1.0', f'"reward": {literal}'))
    del result["reward_components"]
    with pytest.raises(InvalidResultError, match=r"`reward` is .*, expected a finite number") as raised:
        convert(result)
    assert "agent 'synonym_agent', prompt group 7 sample 2" in str(raised.value)
    assert '"_rowidx": 3' in str(raised.value)


@pytest.mark.parametrize("value", [float("nan"), float("inf"), float("-inf")])
def test_a_non_finite_logprob_is_an_invalid_result(value: float) -> None:
    result = load("run_result_two_turn_tool_call.json")
    result["response"]["output"][1]["generation_log_probs"][1] = value
    with pytest.raises(InvalidResultError, match=rf"turn 0: generation_log_probs holds {value}, expected finite"):
        convert(result)


def test_a_non_finite_reward_component_is_an_invalid_result() -> None:
    result = load("run_result_two_turn_tool_call.json")
    result["reward_components"]["format"] = float("nan")
    with pytest.raises(InvalidResultError, match=r"`reward_components.format` is NaN, expected a finite number"):
        convert(result)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda r: r.pop("reward"), r"`reward` must be a number, got null"),
        (lambda r: r.update(reward="1.0"), r"`reward` must be a number, got 1\.0"),
        (lambda r: r.update(reward=True), r"`reward` must be a number, got true"),
        (
            lambda r: r["response"]["output"][1].update(generation_token_ids=["5", 6, 7]),
            r"turn 0: generation_token_ids\.0",
        ),
        (lambda r: r["response"]["output"][1].update(generation_token_ids=[5, -6, 7]), r"negative token id"),
        (lambda r: r["response"]["output"][1].pop("prompt_token_ids"), r"must be given together"),
        (lambda r: r["response"]["output"][1].update(generation_log_probs="-0.1"), r"generation_log_probs"),
        (lambda r: r["response"].update(output={"items": []}), r"no response\.output list"),
        (lambda r: r["response"]["output"].append([1, 2]), r"output item is not an object"),
        (lambda r: r["instance_config"].update(mask_sample="no"), r"mask_sample` must be true or false"),
    ],
)
def test_missing_and_mistyped_fields_are_invalid_results_naming_the_field(change: Any, message: str) -> None:
    result = load("run_result_two_turn_tool_call.json")
    change(result)
    with pytest.raises(InvalidResultError, match=message):
        convert(result)


def test_a_row_without_agent_ref_names_the_default_agent() -> None:
    result = load("run_result_two_turn_tool_call.json")
    result["reward"] = float("nan")
    row = {key: value for key, value in ROW.items() if key != "agent_ref"}
    with pytest.raises(InvalidResultError, match=r"the default agent \(the row has no agent_ref\.name\)"):
        trajectory_from_result(result, row=row, group_id=0, sample_index=0, policy_version=0)


# Property (150 examples, a few seconds): any JSON, in particular the valid result with fields replaced, deleted
# or nested one level deeper, gives either a trajectory a step can use or an InvalidResultError, nothing else.
JSON_LEAVES = st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=4)
JSON_VALUES = st.recursive(
    JSON_LEAVES,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3),
    max_leaves=8,
)


def _paths(value: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every key path inside `value` (dict keys and list indices)."""
    children = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else []
    found = []
    for key, child in children:
        found.append((*prefix, key))
        found.extend(_paths(child, (*prefix, key)))
    return found


@st.composite
def mutated_results(draw: st.DrawFn) -> Any:
    result: Any = load("run_result_two_turn_tool_call.json")
    for _ in range(draw(st.integers(1, 3))):
        paths = _paths(result)
        if not paths:
            break
        *parent_path, key = draw(st.sampled_from(paths))
        parent = result
        for part in parent_path:
            parent = parent[part]
        action = draw(st.sampled_from(["replace", "delete", "nest in a list", "nest in an object"]))
        if action == "replace":
            parent[key] = draw(JSON_VALUES)
        elif action == "delete":
            del parent[key]
        elif action == "nest in a list":
            parent[key] = [parent[key]]
        else:
            parent[key] = {"value": parent[key]}
    return result


def _assert_usable(trajectory: Any) -> None:
    assert math.isfinite(trajectory.reward)
    assert len(trajectory.token_ids) == len(trajectory.loss_mask) == len(trajectory.generation_logprobs)
    assert all(type(token) is int and token >= 0 for token in trajectory.token_ids)
    assert all(math.isfinite(value) for value in trajectory.generation_logprobs)
    assert all(math.isfinite(value) for value in trajectory.reward_components.values())


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(result=mutated_results() | JSON_VALUES)
def test_any_result_json_becomes_a_usable_trajectory_or_an_invalid_result(result: Any) -> None:
    try:
        trajectory = convert(result)
    except InvalidResultError as error:
        assert "agent 'synonym_agent', prompt group 7 sample 2" in str(error)
        return
    _assert_usable(trajectory)


def cut_after_first_call() -> dict[str, Any]:
    """The two-turn fixture as an agent with max_steps 1 ends it: one model call (a tool call), the tool's output,
    no final answer, and the response still `completed` (NeMo-Gym's simple_agent reports a cut rollout so)."""
    result = load("run_result_two_turn_tool_call.json")
    result["response"]["output"] = result["response"]["output"][:3]
    assert result["response"]["status"] == "completed"
    return result


def test_a_rollout_cut_by_the_step_limit_is_truncated() -> None:
    def truncated(result: dict[str, Any], limit: StepLimit | None) -> bool:
        return trajectory_from_result(
            result, row=ROW, group_id=7, sample_index=2, policy_version=5, step_limit=limit
        ).truncated

    assert truncated(cut_after_first_call(), StepLimit(1)) is True
    assert truncated(cut_after_first_call(), StepLimit(1, counts_tool_calls=True)) is True  # one tool call
    assert truncated(cut_after_first_call(), StepLimit(2)) is False  # the agent stopped before its limit
    assert truncated(cut_after_first_call(), None) is False  # limit unknown
    # Ending on a final answer is a finished rollout, even with every step used.
    assert truncated(load("run_result_two_turn_tool_call.json"), StepLimit(2)) is False


def test_has_invalid_tool_call_reads_only_assistant_message_text() -> None:
    # An unexecuted call left in the answer's text is invalid; a parsed function_call item and the user's text
    # are not looked at.
    def result(*items: dict[str, object]) -> dict[str, object]:
        return {"response": {"output": list(items)}}

    markup = re.compile(r"<tool_call>")
    call = {"type": "function_call", "name": "add", "arguments": "<tool_call>"}
    user = {"type": "message", "role": "user", "content": "<tool_call>"}
    text = {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": 'x <tool_call>{"a"'}]}
    assert not has_invalid_tool_call(result(call, user), [markup])
    assert has_invalid_tool_call(result(call, text), [markup])
    assert has_invalid_tool_call(result({"type": "message", "role": "assistant", "content": "<tool_call>"}), [markup])
    assert not has_invalid_tool_call(result(text), [])
    assert assistant_texts(result(user, text, call)) == ['x <tool_call>{"a"']
