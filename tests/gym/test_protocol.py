"""Wire models against fixtures shaped like docs/gym-protocol.md, Policy server: round trips, ignored extras,
rejected input."""

import json
from pathlib import Path

import pytest
from pydantic import ValidationError

from asyncppo.gym.protocol import ChatCompletionRequest, ChatCompletionResponse, RequestMessage, TokenizeRequest

FIXTURES = Path(__file__).parent / "fixtures"


def load(name: str) -> dict:
    return json.loads((FIXTURES / name).read_text())


def test_turn2_request_keeps_token_fields_and_ignores_gym_extras() -> None:
    raw = load("chat_request_turn2.json")
    request = ChatCompletionRequest.model_validate(raw)
    assistant = request.messages[1]
    assert assistant.has_tokens
    assert assistant.prompt_token_ids == raw["messages"][1]["prompt_token_ids"]
    assert assistant.generation_log_probs == raw["messages"][1]["generation_log_probs"]
    assert [call.function.name for call in assistant.tool_calls or []] == ["get_weather", "get_weather"]
    dumped = request.model_dump(exclude_none=True)
    # The 4.2 extras are accepted and dropped, not carried: the server never acts on them.
    for extra in ("metadata", "parallel_tool_calls", "tool_choice", "reasoning_effort"):
        assert extra in raw and extra not in dumped
    # chat_template_kwargs is carried: the template renders with it, on /tokenize too, so both agree.
    assert dumped["chat_template_kwargs"] == raw["chat_template_kwargs"]
    assert "reasoning_content" not in dumped["messages"][1] and "routed_experts" not in dumped["messages"][1]
    assert ChatCompletionRequest.model_validate(dumped) == request


def test_response_round_trips_and_ignores_vllm_extras() -> None:
    raw = load("chat_response.json")
    response = ChatCompletionResponse.model_validate(raw)
    message = response.choices[0].message
    assert message.generation_token_ids == [151657, 90, 151645]
    assert message.generation_log_probs == [-0.02, -0.5, -9999.0]
    assert response.choices[0].finish_reason == "tool_calls"
    dumped = response.model_dump(exclude_none=True)
    assert "system_fingerprint" not in dumped and "refusal" not in dumped["choices"][0]["message"]
    assert ChatCompletionResponse.model_validate(dumped) == response


@pytest.mark.parametrize("missing", ["prompt_token_ids", "generation_token_ids", "generation_log_probs"])
def test_token_fields_must_come_together(missing: str) -> None:
    message = load("chat_request_turn2.json")["messages"][1]
    del message[missing]
    with pytest.raises(ValidationError, match="must be given together"):
        RequestMessage.model_validate(message)


def test_generation_ids_and_logprobs_must_have_equal_lengths() -> None:
    message = load("chat_request_turn2.json")["messages"][1]
    message["generation_log_probs"] = message["generation_log_probs"][:-1]
    with pytest.raises(ValidationError, match="9 ids but generation_log_probs has 8"):
        RequestMessage.model_validate(message)


def test_only_assistant_messages_may_carry_tokens() -> None:
    bundle = {"prompt_token_ids": [1], "generation_token_ids": [2], "generation_log_probs": [-0.1]}
    with pytest.raises(ValidationError, match="a user message carries token fields"):
        RequestMessage.model_validate({"role": "user", "content": "hi", **bundle})


@pytest.mark.parametrize("missing", ["model", "messages"])
def test_request_requires_model_and_messages(missing: str) -> None:
    raw = load("chat_request_turn2.json")
    del raw[missing]
    with pytest.raises(ValidationError, match=missing):
        ChatCompletionRequest.model_validate(raw)


def test_response_requires_usage_and_finish_reason() -> None:
    raw = load("chat_response.json")
    del raw["usage"], raw["choices"][0]["finish_reason"]
    with pytest.raises(ValidationError) as caught:
        ChatCompletionResponse.model_validate(raw)
    assert {error["loc"][-1] for error in caught.value.errors()} == {"usage", "finish_reason"}


def test_tokenize_request_forbids_unknown_options_and_needs_one_form() -> None:
    with pytest.raises(ValidationError, match="continue_final_message"):
        TokenizeRequest.model_validate({"prompt": "hi", "continue_final_message": True})
    with pytest.raises(ValidationError, match="exactly one of"):
        TokenizeRequest.model_validate({"prompt": "hi", "messages": [{"role": "user", "content": "hi"}]})
    with pytest.raises(ValidationError, match="exactly one of"):
        TokenizeRequest.model_validate({})
