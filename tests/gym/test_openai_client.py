"""The real `openai` client against a real PolicyServer (scripted generator): both routes parse into the client's own
types, the token fields stay reachable, and a Responses tool turn can be sent back through the client."""

from collections.abc import Iterator
from typing import cast

import pytest
from gym_fakes import ScriptedGenerator, policy_server_of
from transformers import PreTrainedTokenizerBase

from asyncppo.models.tiny import EOS_TOKEN_ID

pytest.importorskip("openai")  # a guard only: openai is in the dev extra
import openai
from openai.types.chat import ChatCompletionMessageFunctionToolCall
from openai.types.responses import (
    FunctionToolParam,
    Response,
    ResponseFunctionToolCall,
    ResponseInputItemParam,
    ResponseOutputMessage,
)

API_KEY = "test-key"
TOOL_TURN = 'Checking.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Lima"}}\n</tool_call>'
RESPONSES_TOOL: FunctionToolParam = {
    "type": "function",
    "name": "get_weather",
    "parameters": {"type": "object"},
    "strict": True,
}
TOKEN_FIELDS = ("prompt_token_ids", "generation_token_ids", "generation_log_probs")


@pytest.fixture
def client(tokenizer: PreTrainedTokenizerBase) -> Iterator[openai.OpenAI]:
    """An OpenAI client of a server whose model always says "Checking." and calls get_weather once."""
    generator = ScriptedGenerator([*tokenizer.encode(TOOL_TURN, add_special_tokens=False), EOS_TOKEN_ID])
    server = policy_server_of(generator, tokenizer, max_model_len=512, api_key=API_KEY)
    with server, openai.OpenAI(base_url=server.url, api_key=API_KEY, max_retries=0) as client:
        yield client


def test_chat_completion_parses_and_carries_the_token_fields(client: openai.OpenAI) -> None:
    completion = client.chat.completions.create(
        model="policy",
        messages=[{"role": "user", "content": "Weather in Lima?"}],
        temperature=1.0,
        top_p=1.0,
        max_tokens=64,
        logprobs=True,
        top_logprobs=0,
        extra_body={"return_tokens_as_token_ids": True},
    )
    choice = completion.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content == "Checking."
    [call] = choice.message.tool_calls or []
    assert isinstance(call, ChatCompletionMessageFunctionToolCall)
    assert call.function.name == "get_weather" and call.function.arguments == '{"city": "Lima"}'
    extra = choice.message.model_extra or {}
    assert completion.usage is not None
    num_generated = completion.usage.completion_tokens
    assert len(extra["generation_token_ids"]) == len(extra["generation_log_probs"]) == num_generated
    assert extra["generation_token_ids"][-1] == EOS_TOKEN_ID


def test_responses_parse_into_the_clients_types_and_a_tool_turn_goes_back(client: openai.OpenAI) -> None:
    question: list[ResponseInputItemParam] = [{"role": "user", "content": "Weather in Lima?"}]
    response = client.responses.create(
        model="policy", input=question, tools=[RESPONSES_TOOL], temperature=1.0, top_p=1.0, max_output_tokens=64
    )
    # Strict validation against openai-python's own model: every required field is there with the right type.
    Response.model_validate(response.model_dump())
    assert response.status == "completed" and response.output_text == "Checking."
    message, call = response.output
    assert isinstance(message, ResponseOutputMessage) and isinstance(call, ResponseFunctionToolCall)
    assert call.name == "get_weather" and call.call_id == call.id
    assert not any(field in (message.model_extra or {}) for field in TOKEN_FIELDS)
    tokens = call.model_extra or {}
    assert response.usage is not None
    assert len(tokens["prompt_token_ids"]) == response.usage.input_tokens
    assert len(tokens["generation_token_ids"]) == response.usage.output_tokens

    # Turn 2: every output item goes back as the client dumped it (token fields included), plus the tool output.
    # The cast: the client's input TypedDicts do not declare the token fields the items carry.
    items = cast(list[ResponseInputItemParam], [item.model_dump(exclude_none=True) for item in response.output])
    tool_output: ResponseInputItemParam = {"type": "function_call_output", "call_id": call.call_id, "output": "21 C"}
    second = client.responses.create(
        model="policy",
        input=[*question, *items, tool_output],
        tools=[RESPONSES_TOOL],
        temperature=1.0,
        top_p=1.0,
        max_output_tokens=64,
    )
    seen = tokens["prompt_token_ids"] + tokens["generation_token_ids"]
    assert (second.output[-1].model_extra or {})["prompt_token_ids"][: len(seen)] == seen


def test_a_refused_request_raises_the_clients_bad_request_error(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError, match="matches no sampling profile"):
        client.responses.create(model="policy", input="hi", temperature=0.5, top_p=1.0)
    with pytest.raises(openai.BadRequestError, match="top_k=40 is not allowed"):
        client.chat.completions.create(
            model="policy",
            messages=[{"role": "user", "content": "hi"}],
            temperature=1.0,
            top_p=1.0,
            extra_body={"top_k": 40},
        )
