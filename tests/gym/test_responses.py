"""POST /v1/responses: wire models against fixtures shaped like docs/gym-protocol.md, Policy server, items <-> chat
conversion, and a real PolicyServer (scripted generator, tiny tokenizer) keeping a multi-turn tool conversation
token-exact."""

import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from gym_fakes import ScriptedGenerator, policy_server_of
from pydantic import ValidationError
from transformers import PreTrainedTokenizerBase

from asyncppo.gym.policy_server_runner import PolicyServer
from asyncppo.gym.protocol import OFF_POLICY_KNOBS, FunctionCall, ResponseMessage, ToolCall
from asyncppo.gym.responses import (
    FunctionCallItem,
    OutputMessage,
    ReasoningItem,
    ResponsesInputError,
    ResponsesRequest,
    ResponsesResponse,
    UnsupportedItem,
    check_request,
)
from asyncppo.gym.responses_conversion import chat_messages, chat_tools, output_items
from asyncppo.models.tiny import EOS_TOKEN_ID

FIXTURES = Path(__file__).parent / "fixtures"
TOKEN_FIELDS = ("prompt_token_ids", "generation_token_ids", "generation_log_probs")
MAX_MODEL_LEN = 512
TOOLS = [{"type": "function", "name": "get_weather", "parameters": {"type": "object"}, "strict": True}]
# Turn 1 of the 2.4 example as the tiny model would write it: reasoning, then two calls of one tool.
TWO_CALLS = (
    "<think>need both cities</think>\n"
    '<tool_call>\n{"name": "get_weather", "arguments": {"city": "NYC"}}\n</tool_call>\n'
    '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Boston"}}\n</tool_call>'
)


def load(name: str) -> dict:
    return json.loads((FIXTURES / name).read_text())


def request_with(items: list[dict] | str, **fields: object) -> ResponsesRequest:
    return ResponsesRequest.model_validate({"input": items, "temperature": 1.0, "top_p": 1.0} | fields)


def test_turn1_response_round_trips_with_tokens_on_the_last_item_only() -> None:
    raw = load("responses_response_turn1.json")
    response = ResponsesResponse.model_validate(raw)
    assert [type(item) for item in response.output] == [ReasoningItem, FunctionCallItem, FunctionCallItem]
    assert [item.has_tokens for item in response.output] == [False, False, True]
    assert response.model_dump(mode="json", exclude_none=True) == raw


def test_turn2_request_keeps_items_and_tokens_and_drops_unknown_fields() -> None:
    raw = load("responses_request_turn2.json")
    request = ResponsesRequest.model_validate(raw)
    assert isinstance(request.input, list)
    assert [item.type for item in request.input] == ["message"] + ["reasoning"] + ["function_call"] * 2 + [
        "function_call_output"
    ] * 2
    last_call = request.input[3]
    assert isinstance(last_call, FunctionCallItem)
    assert last_call.generation_token_ids == raw["input"][3]["generation_token_ids"]
    dumped = request.model_dump(mode="json", exclude_none=True)
    # Accepted and ignored: nothing the server acts on is carried (module docstring of gym/responses.py).
    for ignored in ("store", "user", "reasoning", "truncation", "include", "prompt_cache_key"):
        assert ignored in raw and ignored not in dumped
    assert "routed_experts" not in dumped["input"][3]
    assert dumped["metadata"] == raw["metadata"] and dumped["text"] == raw["text"]
    assert ResponsesRequest.model_validate(dumped) == request


def test_every_off_policy_knob_is_a_declared_field_so_it_is_rejected_not_ignored() -> None:
    # check_sampling reads each knob by name; an undeclared one would be dropped as an unknown field.
    assert set(OFF_POLICY_KNOBS) <= set(ResponsesRequest.model_fields)
    assert request_with("hi", presence_penalty=0.5).presence_penalty == 0.5


def test_missing_input_and_half_a_token_bundle_are_validation_errors() -> None:
    with pytest.raises(ValidationError, match="input"):
        ResponsesRequest.model_validate({"model": "policy", "temperature": 1.0, "top_p": 1.0})
    item = load("responses_request_turn2.json")["input"][3]
    del item["generation_log_probs"]
    with pytest.raises(ValidationError, match="must be given together"):
        request_with([item])


def test_items_of_one_model_call_become_one_assistant_message_with_its_tokens() -> None:
    raw = load("responses_request_turn2.json")
    messages = chat_messages(ResponsesRequest.model_validate(raw))
    assert [message.role for message in messages] == ["system", "user", "assistant", "tool", "tool"]
    assert messages[0].content == "You are a weather assistant."
    assistant = messages[2]
    assert assistant.content == "<think>need both cities</think>"
    assert [(call.id, call.function.arguments) for call in assistant.tool_calls or []] == [
        ("call_1", '{"city": "NYC"}'),
        ("call_2", '{"city": "Boston"}'),
    ]
    for field in TOKEN_FIELDS:
        assert getattr(assistant, field) == raw["input"][3][field]
    # A tool output given as text parts is joined to one string.
    assert [(m.tool_call_id, m.content) for m in messages[3:]] == [
        ("call_1", '{"city": "NYC", "temperature": 12}'),
        ("call_2", '{"city": "Boston", "temperature": 9}'),
    ]


def _tokens(first_id: int) -> dict[str, list]:
    return {"prompt_token_ids": [1, 2], "generation_token_ids": [first_id], "generation_log_probs": [-0.5]}


def _call(call_id: str) -> dict:
    return {"type": "function_call", "call_id": call_id, "name": "f", "arguments": "{}"}


def _reasoning(text: str, **tokens: list) -> dict:
    return {"type": "reasoning", "summary": [{"type": "summary_text", "text": text}], **tokens}


@pytest.mark.parametrize(
    ("items", "expected"),
    [
        # A token-carrying item ends its model call: a reasoning-only call, then an answer, are two messages.
        (
            [_reasoning("a", **_tokens(5)), {"role": "assistant", "content": [{"type": "output_text", "text": "b"}]}],
            [("<think>a</think>", [], [5]), ("b", [], None)],
        ),
        # Without tokens, going back in output order (a reasoning after a call) starts the next model call.
        (
            [_call("c1"), _reasoning("x"), {"role": "assistant", "content": "y"}, _call("c2")],
            [("", ["c1"], None), ("<think>x</think>y", ["c2"], None)],
        ),
    ],
)
def test_model_call_boundaries(items: list[dict], expected: list) -> None:
    messages = chat_messages(request_with([{"role": "user", "content": "q"}, *items]))
    got = [(m.content, [call.id for call in m.tool_calls or []], m.generation_token_ids) for m in messages[1:]]
    assert got == expected


def test_string_input_and_text_parts_become_plain_messages() -> None:
    assert [(m.role, m.content) for m in chat_messages(request_with("hi"))] == [("user", "hi")]
    parts = [{"type": "input_text", "text": "a "}, {"type": "input_text", "text": "b"}]
    messages = chat_messages(request_with([{"type": "message", "role": "developer", "content": parts}]))
    assert [(m.role, m.content) for m in messages] == [("developer", "a b")]


@pytest.mark.parametrize(
    ("item", "fragment"),
    [
        ({"type": "web_search_call", "id": "ws_1", "status": "completed"}, "input[1]: item type 'web_search_call'"),
        ({"type": "item_reference", "id": "msg_1"}, "item type 'item_reference' is not supported"),
        (
            {"role": "user", "content": [{"type": "input_image", "image_url": "data:"}]},
            "input[1]: content part type 'input_image' is not supported",
        ),
        ({"role": "user", "content": "hi", **_tokens(5)}, "input[1]: a user message carries token fields"),
    ],
)
def test_items_that_cannot_be_served_are_named(item: dict, fragment: str) -> None:
    request = request_with([{"role": "user", "content": "q"}, item])
    if item.get("type") in ("web_search_call", "item_reference"):
        assert isinstance(request.input[1], UnsupportedItem)  # pyright: ignore[reportIndexIssue]
    with pytest.raises(ResponsesInputError, match=fragment.replace("[", r"\[").replace("]", r"\]")):
        chat_messages(request)


def test_tools_are_flattened_to_chat_tools_without_strict() -> None:
    tool = {"type": "function", "name": "f", "description": "d", "parameters": {"type": "object"}, "strict": True}
    assert chat_tools([tool]) == [
        {"type": "function", "function": {"name": "f", "description": "d", "parameters": {"type": "object"}}}
    ]
    assert chat_tools([]) is None
    with pytest.raises(ResponsesInputError, match=r"tools\[0\]: tool type 'web_search'"):
        chat_tools([{"type": "web_search"}])


@pytest.mark.parametrize(
    ("fields", "fragment"),
    [
        ({"previous_response_id": "resp_1"}, "stores no responses"),
        ({"prompt": {"id": "pmpt_1"}}, "stored prompt template"),
        ({"background": True}, "background=true"),
        ({"text": {"format": {"type": "json_schema", "schema": {}}}}, "'json_schema' is not supported"),
    ],
)
def test_fields_asking_for_what_the_server_cannot_do_are_refused(fields: dict, fragment: str) -> None:
    with pytest.raises(ResponsesInputError, match=fragment):
        check_request(request_with([], **fields))
    check_request(request_with([], text={"format": {"type": "text"}}))


def generated(content: str, tool_calls: list[ToolCall] | None = None) -> ResponseMessage:
    """A generated message as the policy server returns it, with a one-token bundle."""
    return ResponseMessage.model_validate({"content": content, "tool_calls": tool_calls, **_tokens(5)})


def test_generated_message_becomes_reasoning_message_and_calls_with_tokens_on_the_last() -> None:
    calls = [ToolCall(id=f"call_{i}", function=FunctionCall(name="f", arguments="{}")) for i in (1, 2)]
    items = output_items(generated("<think> plan </think>\nDone.", calls), incomplete=False)
    assert [item.type for item in items] == ["reasoning", "message", "function_call", "function_call"]
    reasoning, text, _, last = items
    assert isinstance(reasoning, ReasoningItem) and reasoning.summary[0].text == "plan"
    assert isinstance(text, OutputMessage) and text.content[0].text == "Done." and text.id.startswith("msg_")
    assert isinstance(last, FunctionCallItem) and last.call_id == last.id == "call_2"
    assert [item.has_tokens for item in items] == [False, False, False, True]
    assert (last.prompt_token_ids, last.generation_token_ids) == ([1, 2], [5])


def test_empty_generation_still_has_an_item_for_its_tokens_and_a_cut_one_is_incomplete() -> None:
    [item] = output_items(generated(""), incomplete=False)
    assert isinstance(item, OutputMessage) and item.content[0].text == "" and item.has_tokens
    [cut] = output_items(generated("<think>unfinis"), incomplete=True)
    assert isinstance(cut, OutputMessage) and cut.status == "incomplete" and cut.content[0].text == "<think>unfinis"


def serve(tokenizer: PreTrainedTokenizerBase, generator: ScriptedGenerator) -> PolicyServer:
    return policy_server_of(generator, tokenizer, MAX_MODEL_LEN)


@pytest.fixture
def two_calls(tokenizer: PreTrainedTokenizerBase) -> Iterator[tuple[str, ScriptedGenerator]]:
    """(root URL, generator) of a server whose model always reasons and calls get_weather twice."""
    generator = ScriptedGenerator([*tokenizer.encode(TWO_CALLS, add_special_tokens=False), EOS_TOKEN_ID])
    with serve(tokenizer, generator) as server:
        yield server.url.removesuffix("/v1"), generator


def respond(root: str, items: list[dict] | str, **overrides: object) -> httpx.Response:
    body = {"model": "policy", "input": items, "tools": TOOLS, "temperature": 1.0, "top_p": 1.0}
    return httpx.post(f"{root}/v1/responses", json=body | {"max_output_tokens": 256} | overrides, timeout=30)


def test_two_turn_tool_call_keeps_a_token_exact_history(two_calls: tuple[str, ScriptedGenerator]) -> None:
    root, generator = two_calls
    question = [{"role": "user", "content": "weather in NYC and Boston?"}]
    first = respond(root, question)
    assert first.status_code == 200, first.text
    turn1 = first.json()
    assert turn1["status"] == "completed" and turn1["id"].startswith("resp_")
    output = turn1["output"]
    assert [item["type"] for item in output] == ["reasoning", "function_call", "function_call"]
    assert output[0]["summary"] == [{"type": "summary_text", "text": "need both cities"}]
    assert [json.loads(item["arguments"]) for item in output[1:]] == [{"city": "NYC"}, {"city": "Boston"}]
    assert [all(field in item for field in TOKEN_FIELDS) for item in output] == [False, False, True]
    seen = output[-1]["prompt_token_ids"] + output[-1]["generation_token_ids"]
    assert turn1["usage"]["total_tokens"] == len(seen)
    # The agent sends every item back unchanged and adds the tool outputs (docs/gym-protocol.md, Multi-turn token
    # exactness).
    results = [{"type": "function_call_output", "call_id": item["call_id"], "output": "12 C"} for item in output[1:]]
    second = respond(root, question + output + results)
    assert second.status_code == 200, second.text
    turn2 = second.json()["output"][-1]
    assert turn2["prompt_token_ids"][: len(seen)] == seen
    assert list(generator.requests[1].prompt_token_ids) == turn2["prompt_token_ids"]
    assert len(turn2["prompt_token_ids"]) > len(seen)  # the tool results and the next assistant header follow


@pytest.mark.parametrize(
    ("overrides", "fragment"),
    [
        ({"temperature": 0.7}, "matches no sampling profile"),
        ({"top_p": None}, "must both be set explicitly"),
        ({"top_k": 5}, "top_k=5 is not allowed"),
        ({"stop": ["\n"]}, "stop=['\\n'] is not supported"),
        ({"stream": True}, "only n=1 without streaming"),
        ({"n": 2}, "only n=1"),
        ({"max_output_tokens": 0}, "max_output_tokens must be >= 1"),
        ({"input": "x " * 600}, "context length"),
        ({"input": [{"type": "mcp_call", "id": "m"}]}, "item type 'mcp_call' is not supported"),
        ({"previous_response_id": "resp_1"}, "stores no responses"),
    ],
)
def test_rule_violations_get_400_with_the_reason(
    two_calls: tuple[str, ScriptedGenerator], overrides: dict, fragment: str
) -> None:
    response = respond(two_calls[0], "hi", **overrides)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert fragment in error["message"] and error["type"] == "invalid_request_error"


def test_unknown_model_is_404_and_an_absent_model_means_the_served_one(
    two_calls: tuple[str, ScriptedGenerator],
) -> None:
    assert respond(two_calls[0], "hi", model="other").status_code == 404
    answer = respond(two_calls[0], "hi", model=None)
    assert answer.status_code == 200 and answer.json()["model"] == "policy"


def test_length_stop_is_incomplete_and_the_budget_is_clamped(tokenizer: PreTrainedTokenizerBase) -> None:
    generator = ScriptedGenerator(tokenizer.encode("a long answer", add_special_tokens=False), finish_reason="length")
    with serve(tokenizer, generator) as server:
        body = respond(server.url.removesuffix("/v1"), "hi", max_output_tokens=3, instructions="Be brief.").json()
    assert body["status"] == "incomplete" and body["incomplete_details"] == {"reason": "max_output_tokens"}
    [message] = body["output"]
    assert message["status"] == "incomplete" and len(message["generation_token_ids"]) == 3
    assert generator.requests[0].sampling.max_new_tokens == 3
    assert body["instructions"] == "Be brief." and body["usage"]["output_tokens"] == 3
    # The instructions reached the prompt as a leading system message.
    assert "Be brief." in tokenizer.decode(message["prompt_token_ids"])
