"""The built-in agent with several policy servers (one per generator worker): each rollout sticks to one
server for all its turns, and rollouts take the servers in turn."""

import json
from collections.abc import Sequence
from concurrent.futures import Future

import httpx
from gym_fakes import policy_server_of
from transformers import PreTrainedTokenizerBase

from asyncppo.generation.protocol import GenerationRequest, GenerationResult
from asyncppo.gym.servers.launch import launch_builtin_gym
from asyncppo.gym.servers.resources import SESSION_COUNTER_TOOLS
from asyncppo.models.tiny import EOS_TOKEN_ID


class TwoTurns:
    """Answers a tool call on a conversation's first turn and a final answer on its second; counts requests."""

    def __init__(self, tokenizer: PreTrainedTokenizerBase) -> None:
        call = '<tool_call>\n{"name": "increment", "arguments": {}}\n</tool_call>'
        self.turns = [[*tokenizer.encode(text, add_special_tokens=False), EOS_TOKEN_ID] for text in (call, "1")]
        self.prompts: list[tuple[int, ...]] = []

    def submit(self, request: GenerationRequest) -> "Future[GenerationResult]":
        # A prompt that already holds a tool response is the second turn.
        tokens = self.turns[1 if 5 in request.prompt_token_ids else 0]
        self.prompts.append(tuple(request.prompt_token_ids))
        future: Future[GenerationResult] = Future()
        future.set_result(GenerationResult(tuple(tokens), (-0.5,) * len(tokens), "stop", 0, 0))
        return future


def test_rollouts_alternate_between_policy_servers_and_stick_to_one(tokenizer: PreTrainedTokenizerBase) -> None:
    generators: Sequence[TwoTurns] = [TwoTurns(tokenizer), TwoTurns(tokenizer)]
    servers = [policy_server_of(generator, tokenizer) for generator in generators]

    def row(index: int) -> dict:
        return {
            "responses_create_params": {
                "input": [{"role": "user", "content": f"Count to 1 (rollout {index})."}],
                "tools": SESSION_COUNTER_TOOLS,
                "temperature": 1.0,
                "top_p": 1.0,
            },
            "target_count": 1,
        }

    for server in servers:
        server.start()
    try:
        with launch_builtin_gym([s.url for s in servers], resources=("session_counter",), max_steps=4) as gym:
            url = gym.agent_urls["session_counter_simple_agent"]
            results = [httpx.post(f"{url}/run", json=row(index), timeout=30).json() for index in range(4)]
            config = httpx.get(f"{gym.head_url}/global_config_dict_yaml").json()
    finally:
        for server in servers:
            server.stop()
    assert [result["reward"] for result in results] == [1.0] * 4
    # Two rollouts each, two turns each, and every second turn went where its rollout's first turn went.
    assert [len(generator.prompts) for generator in generators] == [4, 4]
    for generator in generators:
        first_turns = [prompt for prompt in generator.prompts if 5 not in prompt]
        second_turns = [prompt for prompt in generator.prompts if 5 in prompt]
        assert len(first_turns) == len(second_turns) == 2
        assert all(any(second[: len(first)] == first for first in first_turns) for second in second_turns)
    assert all(s.url in config for s in servers) and json.dumps(config)


def test_a_conversation_that_outgrows_the_context_ends_gracefully(tokenizer: PreTrainedTokenizerBase) -> None:
    """The second turn's prompt is over max_model_len: the rollout stops as incomplete and is still verified."""
    generator = TwoTurns(tokenizer)
    messages = [{"role": "user", "content": "Count to 1."}]
    tools = [{"type": "function", "function": {k: v for k, v in SESSION_COUNTER_TOOLS[0].items() if k != "type"}}]
    first_prompt = tokenizer.apply_chat_template(messages, tools=tools, add_generation_prompt=True, tokenize=False)
    first_length = len(tokenizer.encode(str(first_prompt), add_special_tokens=False))
    server = policy_server_of(generator, tokenizer, max_model_len=first_length + len(generator.turns[0]) + 3)
    row = {
        "responses_create_params": {
            "input": messages,
            "tools": SESSION_COUNTER_TOOLS,
            "temperature": 1.0,
            "top_p": 1.0,
        },
        "target_count": 1,
    }
    with server, launch_builtin_gym(server.url, resources=("session_counter",), max_steps=4) as gym:
        reply = httpx.post(f"{gym.agent_urls['session_counter_simple_agent']}/run", json=row, timeout=30)
    assert reply.status_code == 200, reply.text
    result = reply.json()
    assert result["response"]["status"] == "incomplete"
    assert result["response"]["incomplete_details"] == {"reason": "max_output_tokens"}
    assert [item["type"] for item in result["response"]["output"]] == ["function_call", "function_call_output"]
    assert len(generator.prompts) == 1 and result["reward"] == 1.0  # the one increment happened and was verified
