"""Chat messages to the exact prompt token ids, and generated text back to content and tool calls.

Called by the policy server (`gym/policy_server.py`). The prefix splice keeps a multi-turn conversation
token-exact (docs/gym-protocol.md, Multi-turn token exactness): earlier turns enter the prompt as the ids the
engine saw and sampled, not as a re-rendering of their decoded text.
"""

import inspect
import json
import re
import uuid
from collections.abc import Mapping, Sequence
from typing import Any

import jinja2
import tokenizers
from transformers import PreTrainedTokenizerBase

from asyncppo.gym.protocol import FunctionCall, RequestMessage, ToolCall


class PromptError(ValueError):
    """The messages cannot be turned into a prompt (the server answers 400 with this message)."""


def template_messages(messages: Sequence[RequestMessage]) -> list[dict[str, Any]]:
    """Plain dicts for the chat template, without the token fields (the template renders text only)."""
    rendered = []
    for message in messages:
        entry: dict[str, Any] = {"role": message.role, "content": message.content or ""}
        if message.tool_calls:
            entry["tool_calls"] = [call.model_dump() for call in message.tool_calls]
        if message.tool_call_id is not None:
            entry["tool_call_id"] = message.tool_call_id
        rendered.append(entry)
    return rendered


def render_tokens(
    tokenizer: PreTrainedTokenizerBase,
    messages: Sequence[RequestMessage],
    tools: list[dict[str, Any]] | None,
    add_generation_prompt: bool,
    template_kwargs: Mapping[str, Any] | None = None,
) -> list[int]:
    """Token ids of the conversation rendered by the tokenizer's chat template (no re-added special tokens).

    `template_kwargs` are extra template variables (a request's `chat_template_kwargs`); PromptError for one that
    names an argument of the render itself, or for a conversation the template refuses.
    """
    extra = dict(template_kwargs or {})
    reserved = sorted(set(extra) & _render_arguments(tokenizer))
    if reserved:
        raise PromptError(
            f"chat_template_kwargs: {reserved} are arguments of the template render, not template variables; "
            "expected only variables the template reads (e.g. enable_thinking)"
        )
    template_tools: list[Any] | None = list(tools) if tools is not None else None
    try:
        text = tokenizer.apply_chat_template(
            template_messages(messages),
            tools=template_tools,
            add_generation_prompt=add_generation_prompt,
            tokenize=False,
            **extra,
        )
    except jinja2.TemplateError as error:  # the template's raise_exception, or a variable of the wrong shape
        raise PromptError(f"the chat template cannot render these messages: {error}") from None
    assert isinstance(text, str)
    return encode_text(tokenizer, text, add_special_tokens=False)


def encode_text(tokenizer: PreTrainedTokenizerBase, text: str, add_special_tokens: bool) -> list[int]:
    """`tokenizer.encode(text, add_special_tokens=...)`, the same ids, through the Rust tokenizer's
    `encode_batch_fast` when the tokenizer has one in its plain state (no truncation, padding or special-token
    splitting set on it).

    Why: the policy server tokenises on threads beside its event loop, and the usual path holds the GIL while it
    builds and frees its per-token offsets (about 150 ms per million tokens, during which `/health` cannot be
    answered); the fast path skips the offsets (about 25 ms held) and encodes about twice as fast.
    """
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if (
        isinstance(backend, tokenizers.Tokenizer)
        and backend.truncation is None
        and backend.padding is None
        and backend.encode_special_tokens == getattr(tokenizer, "split_special_tokens", False)
    ):
        return backend.encode_batch_fast([text], add_special_tokens=add_special_tokens)[0].ids
    return list(tokenizer.encode(text, add_special_tokens=add_special_tokens))


def _render_arguments(tokenizer: PreTrainedTokenizerBase) -> set[str]:
    """Names apply_chat_template takes itself, plus `messages`, which it passes to the template."""
    parameters = inspect.signature(tokenizer.apply_chat_template).parameters.values()
    names = {parameter.name for parameter in parameters if parameter.kind is not inspect.Parameter.VAR_KEYWORD}
    return names | {"messages"}


def build_prompt(
    tokenizer: PreTrainedTokenizerBase,
    messages: Sequence[RequestMessage],
    tools: list[dict[str, Any]] | None,
    eos_token_id: int,
    required_prefix_token_ids: Sequence[int] | None = None,
    template_kwargs: Mapping[str, Any] | None = None,
) -> list[int]:
    """Prompt ids for the next assistant turn: the template's rendering with earlier turns' exact tokens spliced in.

    Splice rule (NeMo-RL's on-policy prefix repair):
    - prefix = `required_prefix_token_ids` if given, else prompt_token_ids + generation_token_ids of the LAST
      message that carries them (that model call saw and produced exactly these ids). No prefix: plain render.
    - full = render(all messages, generation prompt); partial = render(messages up to and including the last
      assistant message, no generation prompt). N = number of EOS ids in partial.
    - result = prefix (minus one trailing EOS) + full from its N-th EOS onward.
    The cut counts EOS ids instead of positions, so a template that re-renders an earlier turn differently
    (whitespace around tool-call tags, arguments re-serialized, reasoning dropped) cannot shift it. Everything
    after the cut (the closing EOS, tool results, the new generation prompt) comes from the template.
    """
    full = render_tokens(tokenizer, messages, tools, add_generation_prompt=True, template_kwargs=template_kwargs)
    prefix = list(required_prefix_token_ids) if required_prefix_token_ids is not None else None
    carriers = [index for index, message in enumerate(messages) if message.has_tokens]
    if prefix is None and carriers:
        last = messages[carriers[-1]]
        assert last.prompt_token_ids is not None and last.generation_token_ids is not None
        prefix = last.prompt_token_ids + last.generation_token_ids
    if prefix is None:
        return full
    assistants = [index for index, message in enumerate(messages) if message.role == "assistant"]
    if not assistants:
        raise PromptError("required_prefix_token_ids is set but the conversation has no assistant message")
    history = messages[: assistants[-1] + 1]
    partial = render_tokens(tokenizer, history, tools, add_generation_prompt=False, template_kwargs=template_kwargs)
    num_eos = partial.count(eos_token_id)
    eos_positions = [position for position, token in enumerate(full) if token == eos_token_id]
    if num_eos == 0 or len(eos_positions) < num_eos:
        raise PromptError(
            f"cannot splice the earlier turns' tokens: the conversation up to the last assistant message renders "
            f"{num_eos} end-of-turn tokens and the full one {len(eos_positions)} (history must be monotonic)"
        )
    if prefix and prefix[-1] == eos_token_id:
        prefix = prefix[:-1]
    return prefix + full[eos_positions[num_eos - 1] :]


_TOOL_CALL_BLOCK = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.DOTALL)


def parse_generation(text: str) -> tuple[str, list[ToolCall]]:
    """(content, tool calls) of generated text, EOS already removed.

    Each `<tool_call>{"name": ..., "arguments": {...}}</tool_call>` block whose body is a JSON object with a
    string `name` becomes a ToolCall (arguments re-serialized as a JSON string, id `call_<hex>`) and is cut from
    the content; a malformed block stays in the content as text, so nothing the model wrote is lost.
    """
    tool_calls: list[ToolCall] = []
    kept: list[str] = []
    position = 0
    for match in _TOOL_CALL_BLOCK.finditer(text):
        call = _parse_call(match.group(1))
        if call is None:
            continue
        kept.append(text[position : match.start()])
        position = match.end()
        tool_calls.append(call)
    kept.append(text[position:])
    content = "".join(kept)
    # The template joins content and each call with a newline; drop those separators, not the model's text.
    return (content.strip() if tool_calls else content), tool_calls


def _parse_call(body: str) -> ToolCall | None:
    try:
        parsed = json.loads(body)
    except json.JSONDecodeError:
        return None
    if not isinstance(parsed, dict) or not isinstance(parsed.get("name"), str):
        return None
    arguments = parsed.get("arguments", {})
    arguments_text = arguments if isinstance(arguments, str) else json.dumps(arguments, ensure_ascii=False)
    return ToolCall(
        id=f"call_{uuid.uuid4().hex[:24]}", function=FunctionCall(name=parsed["name"], arguments=arguments_text)
    )
