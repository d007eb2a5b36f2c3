"""Prefix splice and tool-call parsing on the tiny tokenizer's ChatML template (no model needed)."""

import copy
import json

import pytest
import tokenizers
from transformers import PreTrainedTokenizerBase

from asyncppo.gym.chat_prompt import PromptError, build_prompt, encode_text, parse_generation, render_tokens
from asyncppo.gym.protocol import RequestMessage
from asyncppo.models.tiny import EOS_TOKEN_ID

TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]
# What the model "wrote": compact JSON, while the template re-renders arguments as `{"city": "Paris"}`.
GENERATED_TEXT = '<tool_call>\n{"name":"get_weather","arguments":{"city":"Paris"}}\n</tool_call><|im_end|>'


def encode(tokenizer: PreTrainedTokenizerBase, text: str) -> list[int]:
    return list(tokenizer.encode(text, add_special_tokens=False))


def turn_two(tokenizer: PreTrainedTokenizerBase) -> tuple[list[RequestMessage], list[int], list[int]]:
    """A conversation after one tool-calling model turn; returns (messages, turn-1 prompt, turn-1 generation)."""
    user = RequestMessage(role="user", content="Weather in Paris?")
    prompt = render_tokens(tokenizer, [user], TOOLS, add_generation_prompt=True)
    generated = encode(tokenizer, GENERATED_TEXT)
    text = tokenizer.decode(generated[:-1], skip_special_tokens=False)
    assert isinstance(text, str)
    content, calls = parse_generation(text)
    assistant = RequestMessage(
        role="assistant",
        content=content,
        tool_calls=calls,
        prompt_token_ids=prompt,
        generation_token_ids=generated,
        generation_log_probs=[-0.5] * len(generated),
    )
    tool = RequestMessage(role="tool", tool_call_id=calls[0].id, content='{"temperature": 21}')
    return [user, assistant, tool], prompt, generated


def test_splice_keeps_the_models_exact_tokens_where_the_template_would_rewrite_them(
    tokenizer: PreTrainedTokenizerBase,
) -> None:
    messages, prompt, generated = turn_two(tokenizer)
    spliced = build_prompt(tokenizer, messages, TOOLS, EOS_TOKEN_ID)
    assert spliced[: len(prompt) + len(generated)] == prompt + generated
    # After the model's own EOS comes the template's rendering of the tool turn and the generation prompt.
    tail = tokenizer.decode(spliced[len(prompt) + len(generated) :], skip_special_tokens=False)
    assert tail == '\n<|im_start|>tool\n<tool_response>\n{"temperature": 21}\n</tool_response><|im_end|>\n' + (
        "<|im_start|>assistant\n"
    )
    # Without the splice the re-rendered arguments differ, so this test would fail on a plain render.
    plain = render_tokens(tokenizer, messages, TOOLS, add_generation_prompt=True)
    assert plain[: len(prompt) + len(generated)] != prompt + generated


def test_no_token_fields_means_the_plain_rendering(tokenizer: PreTrainedTokenizerBase) -> None:
    messages = [RequestMessage(role="user", content="hi"), RequestMessage(role="assistant", content="hello")]
    messages.append(RequestMessage(role="user", content="again"))
    assert build_prompt(tokenizer, messages, None, EOS_TOKEN_ID) == render_tokens(tokenizer, messages, None, True)


def test_length_cut_generation_without_eos_is_closed_by_the_template(tokenizer: PreTrainedTokenizerBase) -> None:
    messages, prompt, generated = turn_two(tokenizer)
    cut = generated[:5]  # finish_reason "length": no EOS sampled
    messages[1] = messages[1].model_copy(update={"generation_token_ids": cut, "generation_log_probs": [-0.5] * 5})
    spliced = build_prompt(tokenizer, messages, TOOLS, EOS_TOKEN_ID)
    assert spliced[: len(prompt) + 5] == prompt + cut and spliced[len(prompt) + 5] == EOS_TOKEN_ID


def test_explicit_required_prefix_wins_over_message_tokens(tokenizer: PreTrainedTokenizerBase) -> None:
    messages, prompt, generated = turn_two(tokenizer)
    required = prompt + generated[:3] + [EOS_TOKEN_ID]
    spliced = build_prompt(tokenizer, messages, TOOLS, EOS_TOKEN_ID, required_prefix_token_ids=required)
    assert spliced[: len(required) - 1] == required[:-1] and spliced[len(required) - 1] == EOS_TOKEN_ID


def test_required_prefix_without_an_assistant_message_is_refused(tokenizer: PreTrainedTokenizerBase) -> None:
    with pytest.raises(PromptError, match="no assistant message"):
        build_prompt(tokenizer, [RequestMessage(role="user", content="hi")], None, EOS_TOKEN_ID, [5, 6])


def test_parse_generation_extracts_calls_and_keeps_text() -> None:
    content, calls = parse_generation('Let me look.\n<tool_call>\n{"name": "f", "arguments": {"x": 1}}\n</tool_call>')
    assert content == "Let me look."
    assert [(call.function.name, json.loads(call.function.arguments)) for call in calls] == [("f", {"x": 1})]
    assert calls[0].id.startswith("call_")


def test_parse_generation_leaves_malformed_blocks_in_the_content() -> None:
    text = "<tool_call>\n{not json}\n</tool_call> done"
    assert parse_generation(text) == (text, [])
    assert parse_generation("plain answer ") == ("plain answer ", [])


@pytest.mark.parametrize("add_special_tokens", [False, True])
def test_encode_text_gives_the_ids_of_tokenizer_encode(
    tokenizer: PreTrainedTokenizerBase, add_special_tokens: bool
) -> None:
    texts = ["", "hi", "<|im_start|>user\nhi<|im_end|>\n", "  two  spaces\n\n\ttab", "héllo wörld 😀 " * 40, "9" * 500]
    for text in texts:
        assert encode_text(tokenizer, text, add_special_tokens) == tokenizer.encode(
            text, add_special_tokens=add_special_tokens
        )


def test_encode_text_takes_the_tokenizers_own_path_when_its_backend_truncates(
    tokenizer: PreTrainedTokenizerBase,
) -> None:
    truncating = copy.deepcopy(tokenizer)
    backend = truncating.backend_tokenizer
    assert isinstance(backend, tokenizers.Tokenizer)
    backend.enable_truncation(5)  # the fast path would return 5 ids
    text = "a sentence of well over five tokens"
    assert encode_text(truncating, text, False) == tokenizer.encode(text, add_special_tokens=False)
    assert len(tokenizer.encode(text, add_special_tokens=False)) > 5
