"""The ChatML template of the tiny tokenizer: exact rendering, tool calls and results, id round trips."""

import json
from pathlib import Path

import pytest
from transformers import PreTrainedTokenizerBase

from asyncppo.models.tiny import build_tiny_tokenizer
from asyncppo.models.tokenizer import load_tokenizer

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather in a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}
TOOL_CONVERSATION = [
    {"role": "system", "content": "You are a helpful assistant."},
    {"role": "user", "content": "Is it warm in Tokyo?"},
    {
        "role": "assistant",
        "content": "Let me check.",
        "tool_calls": [{"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Tokyo"}}}],
    },
    {"role": "tool", "content": '{"temperature": 24, "condition": "sunny"}'},
    {"role": "assistant", "content": "Yes: 24 degrees and sunny."},
]


@pytest.fixture(scope="module")
def tokenizer() -> PreTrainedTokenizerBase:
    return build_tiny_tokenizer(300)


def render(tokenizer: PreTrainedTokenizerBase, messages: list[dict], **kwargs) -> str:
    text = tokenizer.apply_chat_template(messages, tokenize=False, **kwargs)
    assert isinstance(text, str)
    return text


def test_chat_template_renders_plain_turns_exactly(tokenizer: PreTrainedTokenizerBase) -> None:
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2+2?"}]
    expected = "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\n2+2?<|im_end|>\n"
    assert render(tokenizer, messages) == expected


def test_chat_template_renders_tools_calls_and_results_in_order_and_round_trips_through_ids(
    tokenizer: PreTrainedTokenizerBase,
) -> None:
    text = render(tokenizer, TOOL_CONVERSATION, tools=[WEATHER_TOOL])
    expected_parts = [
        # One system block: the system message, then the tool list as JSON.
        "<|im_start|>system\nYou are a helpful assistant.\n\n# Tools",
        "<tools>\n" + json.dumps(WEATHER_TOOL) + "\n</tools>",
        "<|im_end|>\n<|im_start|>user\nIs it warm in Tokyo?<|im_end|>\n",
        '<|im_start|>assistant\nLet me check.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Tokyo"}}'
        "\n</tool_call><|im_end|>\n",
        '<|im_start|>tool\n<tool_response>\n{"temperature": 24, "condition": "sunny"}\n</tool_response><|im_end|>\n',
        "<|im_start|>assistant\nYes: 24 degrees and sunny.<|im_end|>\n",
    ]
    position = 0
    for part in expected_parts:
        found = text.find(part, position)
        assert found >= 0, f"missing or out of order: {part!r} in {text!r}"
        position = found + len(part)
    assert text.endswith(expected_parts[-1])
    assert text.count("<|im_start|>system") == 1

    ids = tokenizer.encode(text, add_special_tokens=False)
    assert tokenizer.decode(ids) == text
    assert tokenizer.encode(tokenizer.decode(ids), add_special_tokens=False) == ids


def test_generation_prompt_ends_with_the_assistant_header(tokenizer: PreTrainedTokenizerBase) -> None:
    text = render(tokenizer, TOOL_CONVERSATION[:2], tools=[WEATHER_TOOL], add_generation_prompt=True)
    assert text.endswith("<|im_start|>user\nIs it warm in Tokyo?<|im_end|>\n<|im_start|>assistant\n")


def test_tool_call_arguments_given_as_a_json_string_are_inserted_verbatim(tokenizer: PreTrainedTokenizerBase) -> None:
    # OpenAI clients send arguments as a JSON string; re-serialising it could change the tokens.
    arguments = '{"city":"Lima",  "unit": "celsius"}'
    calls = [
        {"type": "function", "function": {"name": "get_weather", "arguments": arguments}},
        {"type": "function", "function": {"name": "get_time", "arguments": {}}},
    ]
    text = render(tokenizer, [{"role": "assistant", "content": None, "tool_calls": calls}])
    assert text == (
        "<|im_start|>assistant\n"
        '<tool_call>\n{"name": "get_weather", "arguments": ' + arguments + "}\n</tool_call>\n"
        '<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call><|im_end|>\n'
    )


def test_chat_template_survives_save_and_load(tokenizer: PreTrainedTokenizerBase, tiny_dir: Path) -> None:
    reloaded = load_tokenizer(tiny_dir)
    assert render(reloaded, TOOL_CONVERSATION, tools=[WEATHER_TOOL]) == render(
        tokenizer, TOOL_CONVERSATION, tools=[WEATHER_TOOL]
    )
