"""env.gym.api_key guards every built-in gym server: head, agent and resources answer 401 without it, and the
trainer's GymClient sends it (the agent forwards it to the policy and resources servers)."""

import asyncio
import json
from collections.abc import Iterator
from concurrent.futures import Future

import httpx
import pytest
from gym_fakes import head_client, policy_server_of
from transformers import PreTrainedTokenizerBase

from asyncppo.generation.protocol import GenerationRequest, GenerationResult
from asyncppo.gym.client import AgentHTTPError
from asyncppo.gym.servers.launch import BuiltinGym, launch_builtin_gym
from asyncppo.gym.servers.resources import SESSION_COUNTER_TOOLS
from asyncppo.models.tiny import EOS_TOKEN_ID

KEY = "s3cret"
ROW = {
    "responses_create_params": {"input": "Count to 1.", "tools": SESSION_COUNTER_TOOLS, "max_output_tokens": 64},
    "agent_ref": {"type": "responses_api_agents", "name": "session_counter_simple_agent"},
    "target_count": 1,
}


class TwoTurns:
    """Answers an `increment` tool call, then "Done." (both + EOS)."""

    def __init__(self, tokenizer: PreTrainedTokenizerBase) -> None:
        call = '<tool_call>\n{"name": "increment", "arguments": {}}\n</tool_call>'
        self.turns = [[*tokenizer.encode(text, add_special_tokens=False), EOS_TOKEN_ID] for text in (call, "Done.")]
        self.num_calls = 0

    def submit(self, request: GenerationRequest) -> "Future[GenerationResult]":
        tokens = self.turns[min(self.num_calls, 1)]
        self.num_calls += 1
        future: Future[GenerationResult] = Future()
        future.set_result(GenerationResult(tuple(tokens), (-0.5,) * len(tokens), "stop", 0, 0))
        return future


@pytest.fixture
def keyed_gym(tokenizer: PreTrainedTokenizerBase) -> Iterator[BuiltinGym]:
    """A built-in session_counter gym and its policy server, all requiring KEY."""
    server = policy_server_of(TwoTurns(tokenizer), tokenizer, max_model_len=1024, api_key=KEY)
    with server, launch_builtin_gym(server.url, resources=("session_counter",), max_steps=3, api_key=KEY) as gym:
        yield gym


def test_every_gym_server_answers_401_without_the_key(keyed_gym: BuiltinGym) -> None:
    agent = keyed_gym.agent_urls["session_counter_simple_agent"]
    resources = keyed_gym.resources_urls["session_counter"]
    wrong = {"Authorization": "Bearer nope"}
    for url, body in [(f"{agent}/run", ROW), (f"{resources}/seed_session", {}), (f"{resources}/increment", {})]:
        for headers in ({}, wrong):
            answer = httpx.post(url, json=body, headers=headers, timeout=30)
            assert answer.status_code == 401 and "API key" in answer.json()["error"]["message"], url
    assert httpx.get(f"{keyed_gym.head_url}/global_config_dict_yaml").status_code == 401
    for root in (agent, resources, keyed_gym.head_url):
        assert httpx.get(f"{root}/health").status_code == 200  # readiness probes carry no key


def test_gym_client_with_the_key_runs_a_row_through_head_agent_and_resources(keyed_gym: BuiltinGym) -> None:
    async def run_row(api_key: str | None) -> dict:
        async with head_client(keyed_gym.head_url, api_key=api_key) as client:
            return await client.run(ROW)

    result = asyncio.run(run_row(KEY))
    # The tool call reached the resources server (count 1) and verify rewarded it: the agent sent the key on.
    assert result["reward"] == 1.0 and result["final_count"] == 1, json.dumps(result)[:500]
    with pytest.raises(AgentHTTPError, match="answered 401"):
        asyncio.run(run_row(None))
