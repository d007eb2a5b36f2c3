"""Gym `/run` result -> Trajectory (gym/results.py), on fixtures shaped like docs/gym-protocol.md, sections Agent
server and From result to trajectory.

The two-turn fixture: turn 0 prompt [1 2 3 4] generates the tool call [5 6 7]; the tool output and the next
assistant header are [8 9]; turn 1 prompt [1..9] generates [10 11]. So the history is 1..11 and the loss
mask is 1 exactly on 5 6 7 10 11.
"""

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from asyncppo.gym.results import StepLimit, trajectory_from_result
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


def test_nan_logprobs_raise() -> None:
    result = load("run_result_two_turn_tool_call.json")
    result["response"]["output"][1]["generation_log_probs"][1] = float("nan")
    with pytest.raises(ValueError, match="turn 0 has NaN"):
        convert(result)


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
