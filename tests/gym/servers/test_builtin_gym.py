"""The built-in gym over real HTTP: simple agent against a real PolicyServer (scripted generator, tiny tokenizer),
conversion of its results, GymClient through the head server, and shutdown."""

import asyncio
import json
from collections.abc import Iterator, Sequence
from concurrent.futures import Future

import httpx
import pytest
import yaml
from gym_fakes import head_client, policy_server_of
from transformers import PreTrainedTokenizerBase

from asyncppo.generation.protocol import GenerationRequest, GenerationResult
from asyncppo.gym.client import agent_step_limits_from_config, agent_urls_from_config
from asyncppo.gym.results import StepLimit, trajectory_from_result
from asyncppo.gym.servers.launch import launch_builtin_gym
from asyncppo.gym.servers.resources import MULTI_STEP_TOOLS, SESSION_COUNTER_TOOLS, WEATHER_TOOLS, forecast
from asyncppo.models.tiny import EOS_TOKEN_ID
from asyncppo.types import Trajectory

COUNTER_ROW = {
    "responses_create_params": {
        "input": [{"role": "user", "content": "Count to 2."}],
        "tools": SESSION_COUNTER_TOOLS,
        "temperature": 1.0,
        "top_p": 1.0,
        "max_output_tokens": 64,
    },
    "agent_ref": {"type": "responses_api_agents", "name": "session_counter_simple_agent"},
    "target_count": 2,
}


class ScriptedTurns:
    """A Generator that answers the k-th request with the k-th scripted text (+ EOS), cut to max_new_tokens."""

    def __init__(self, tokenizer: PreTrainedTokenizerBase, texts: Sequence[str]) -> None:
        self.turns = [[*tokenizer.encode(text, add_special_tokens=False), EOS_TOKEN_ID] for text in texts]
        self.prompts: list[list[int]] = []

    def submit(self, request: GenerationRequest) -> "Future[GenerationResult]":
        tokens = self.turns[len(self.prompts)]
        self.prompts.append(list(request.prompt_token_ids))
        limit = request.sampling.max_new_tokens
        finish = "length" if len(tokens) > limit else "stop"
        future: Future[GenerationResult] = Future()
        future.set_result(GenerationResult(tuple(tokens[:limit]), (-0.5,) * min(limit, len(tokens)), finish, 0, 0))
        return future


def tool_call(name: str, arguments: dict) -> str:
    return f"<tool_call>\n{json.dumps({'name': name, 'arguments': arguments})}\n</tool_call>"


@pytest.fixture
def policy_server(request: pytest.FixtureRequest, tokenizer: PreTrainedTokenizerBase) -> Iterator[str]:
    """OpenAI base URL of a PolicyServer answering with the texts the test parametrizes it with (indirect)."""
    generator = ScriptedTurns(tokenizer, request.param)
    with policy_server_of(generator, tokenizer, max_model_len=1024) as server:
        yield server.url


async def run_group(head_url: str, row: dict) -> list[Trajectory]:
    """One training rollout of `row` through `gym_client` (group 0, policy version 0)."""
    async with head_client(head_url) as client:
        return await client.run_group(row, num_generations=1, group_id=0, policy_version=0)


def run(agent_url: str, row: dict) -> dict:
    reply = httpx.post(f"{agent_url}/run", json=row, timeout=30)
    assert reply.status_code == 200, reply.text
    return reply.json()


@pytest.mark.integration
@pytest.mark.parametrize(
    "policy_server",
    [
        (
            tool_call("increment", {}),
            tool_call("increment", {}),
            "The count is 2.",
        )
    ],
    indirect=True,
)
def test_agent_counts_through_tool_calls_and_its_result_converts_to_a_contiguous_trajectory(
    policy_server: str,
) -> None:
    with launch_builtin_gym(policy_server, resources=("session_counter",), max_steps=5) as gym:
        result = run(gym.agent_urls["session_counter_simple_agent"], COUNTER_ROW)
    assert result["reward"] == 1.0 and result["final_count"] == 2  # the cookie reached /increment and /verify
    output = result["response"]["output"]
    kinds = [item["type"] for item in output]
    assert kinds == ["function_call", "function_call_output"] * 2 + ["message"]
    assert json.loads(output[3]["output"]) == {"count": 2}
    trajectory = trajectory_from_result(result, row=COUNTER_ROW, group_id=0, sample_index=0, policy_version=0)
    roles = [span.role for span in trajectory.message_log]
    assert roles == ["user", "assistant", "tool", "assistant", "tool", "assistant"]
    last = output[-1]
    # Contiguous: the last turn's prompt holds every earlier prompt and generation, token for token.
    assert trajectory.token_ids == last["prompt_token_ids"] + last["generation_token_ids"]
    assert sum(trajectory.loss_mask) == sum(len(item.get("generation_token_ids") or []) for item in output)
    assert trajectory.reward == 1.0 and not trajectory.truncated
    assert trajectory.task == {"target_count": 2}


@pytest.mark.integration
@pytest.mark.parametrize(
    "policy_server",
    [
        (
            tool_call("increment", {}),
            tool_call("increment", {}),
        )
    ],
    indirect=True,
)
def test_agent_stops_after_max_steps_and_verifies_what_it_has(policy_server: str) -> None:
    # The scripted policy answers each of the two rollouts (one direct, one through GymClient) with one tool call.
    with launch_builtin_gym(policy_server, resources=("session_counter",), max_steps=1) as gym:
        config = yaml.safe_load(httpx.get(f"{gym.head_url}/global_config_dict_yaml").json())
        assert agent_step_limits_from_config(config) == {"session_counter_simple_agent": StepLimit(1)}
        result = run(gym.agent_urls["session_counter_simple_agent"], COUNTER_ROW)
        [trajectory] = asyncio.run(run_group(gym.head_url, COUNTER_ROW))
    assert result["reward"] == 0.0 and result["final_count"] == 1
    assert [item["type"] for item in result["response"]["output"]] == ["function_call", "function_call_output"]
    # Reported completed, but cut by the step limit the head's config gives: recorded as truncated.
    assert result["response"]["status"] == "completed" and trajectory.truncated


@pytest.mark.integration
@pytest.mark.parametrize(
    "policy_server",
    [
        (
            tool_call("verify", {}),
            '<tool_call>\n{"name": "increment", "arguments": "{oops"}\n</tool_call>',
            "0",
        )
    ],
    indirect=True,
)
def test_agent_feeds_reserved_tool_names_and_bad_arguments_back_to_the_model(policy_server: str) -> None:
    with launch_builtin_gym(policy_server, resources=("session_counter",), max_steps=5) as gym:
        result = run(gym.agent_urls["session_counter_simple_agent"], COUNTER_ROW)
    outputs = [json.loads(item["output"]) for item in result["response"]["output"] if "output" in item]
    assert "Unknown tool 'verify'" in outputs[0]["error"]
    assert "Invalid tool call arguments" in outputs[1]["error"]
    assert result["final_count"] == 0 and result["reward"] == 0.0


@pytest.mark.integration
@pytest.mark.parametrize(
    "policy_server",
    [
        (
            tool_call("get_weather", {"city": "Oslo"}),
            f"It is {forecast('Oslo')['temperature_c']} C.",
        )
    ],
    indirect=True,
)
def test_gym_client_finds_the_agent_through_the_head_server_and_runs_a_row(policy_server: str) -> None:
    row = {
        "responses_create_params": {"input": "Weather in Oslo?", "tools": WEATHER_TOOLS, "max_output_tokens": 64},
        "agent_ref": {"type": "responses_api_agents", "name": "weather_simple_agent"},
    }

    async def collect(head_url: str) -> list:
        async with head_client(head_url, max_concurrency=2) as client:
            assert await client.agent_urls() == gym.agent_urls
            return await client.run_group(row, num_generations=1, group_id=7, policy_version=3)

    with launch_builtin_gym(policy_server, resources=("math", "weather"), max_steps=4) as gym:
        config = yaml.safe_load(httpx.get(f"{gym.head_url}/global_config_dict_yaml").json())
        assert agent_urls_from_config(config) == gym.agent_urls
        assert set(gym.agent_urls) == {"math_simple_agent", "weather_simple_agent"}
        assert config["head_server"]["port"] == int(gym.head_url.rsplit(":", 1)[1])
        [trajectory] = asyncio.run(collect(gym.head_url))
    assert trajectory.reward == 1.0 and trajectory.group_id == 7 and trajectory.policy_version == 3
    assert [span.role for span in trajectory.message_log] == ["user", "assistant", "tool", "assistant"]


@pytest.mark.integration
@pytest.mark.parametrize(
    "policy_server",
    [
        (
            tool_call("add", {"a": 12, "b": 7}),
            tool_call("multiply", {"a": 19, "b": 3}),
            "57",
        )
    ],
    indirect=True,
)
def test_multi_step_row_chains_add_into_multiply_and_trains_as_three_turns(
    policy_server: str, tokenizer: PreTrainedTokenizerBase
) -> None:
    row = {
        "responses_create_params": {
            "input": [{"role": "user", "content": "Compute (12 + 7) * 3. Use the add and multiply tools."}],
            "tools": MULTI_STEP_TOOLS,
        },
        "operands": [12, 7, 3],
        "expected_answer": "57",
        "agent_ref": {"type": "responses_api_agents", "name": "multi_step_simple_agent"},
    }

    with launch_builtin_gym(policy_server, resources=("multi_step",), max_steps=4) as gym:
        [trajectory] = asyncio.run(run_group(gym.head_url, row))
    assert trajectory.reward == 1.0 and trajectory.reward_components == {"correct_answer": 1.0}
    roles = [span.role for span in trajectory.message_log]
    assert roles == ["user", "assistant", "tool", "assistant", "tool", "assistant"]
    # The tool turns hold the tools' compact JSON: the multiply ran on the add's result.
    tool_texts = []
    position = 0
    for span in trajectory.message_log:
        if span.role == "tool":
            tool_texts.append(tokenizer.decode(trajectory.token_ids[position : position + span.num_tokens]))
        position += span.num_tokens
    assert '{"result":19}' in tool_texts[0] and '{"result":57}' in tool_texts[1]
    assert trajectory.task == {"operands": [12, 7, 3], "expected_answer": "57"}


@pytest.mark.integration
@pytest.mark.parametrize(
    "policy_server",
    [
        (
            "x = 4",
            "unused",
        )
    ],
    indirect=True,
)
def test_math_row_with_a_length_stop_is_truncated_and_stop_frees_every_port(policy_server: str) -> None:
    gym = launch_builtin_gym(policy_server, resources=("math",), max_steps=3)
    row = {"responses_create_params": {"input": "2+2?", "temperature": 1.0, "top_p": 1.0, "max_output_tokens": 3}}
    result = run(gym.agent_urls["math_simple_agent"], row | {"expected_answer": "4"})
    urls = [gym.head_url, *gym.agent_urls.values(), *gym.resources_urls.values()]
    gym.stop()
    # "x = 4" + EOS is 6 tokens; 3 fit, so the answer is cut ("x =") and verify finds no number.
    assert result["response"]["status"] == "incomplete" and result["reward"] == 0.0
    trajectory = trajectory_from_result(result, row=row, group_id=0, sample_index=0, policy_version=0)
    assert trajectory.truncated
    for url in urls:
        with pytest.raises(httpx.ConnectError):
            httpx.get(f"{url}/health", timeout=2)


def test_launch_refuses_bad_arguments() -> None:
    with pytest.raises(ValueError, match="max_steps"):
        launch_builtin_gym("http://127.0.0.1:1/v1", max_steps=0)
    with pytest.raises(ValueError, match="distinct"):
        launch_builtin_gym("http://127.0.0.1:1/v1", resources=("math", "math"), max_steps=1)
