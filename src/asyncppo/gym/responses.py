"""The OpenAI Responses API of the policy server: wire models, and Responses items to chat messages and back.

`policy_server.py` serves `POST /v1/responses` with these; generation itself is the chat completions path. This
is what Gym's `vllm_model` proxy does in front of a chat server, done in-process (docs/gym-protocol.md, Policy
server):

    ResponsesRequest{instructions, input items, tools}
      --chat_messages / chat_tools--> [system, user, assistant{"<think>..</think>text", tool_calls, tokens}, tool]
      --policy server: prefix splice, generate--> ResponseMessage{content, tool_calls, tokens}
      --output_items--> [reasoning?, message?, function_call*]    the token fields ride on the LAST item only

One model call = one assistant chat message. Consecutive `reasoning`, assistant `message` and `function_call`
items are one call; the call ends at any other item, after an item carrying the token fields (the last item of
a call), or where an item comes before the previous one in output order (reasoning, message, function_call).

Unknown fields:
- ResponsesRequest: accepted and ignored, as in ChatCompletionRequest. Gym's own model forbids them (422), but
  OpenAI clients send what a newer SDK knows (`prompt_cache_key`, `safety_identifier`, ...) and harnesses add
  their own. What could change sampling is declared instead and rejected when set: `top_k`, `stop`, penalties,
  `logit_bias` (sent through `extra_body`; checked by `check_sampling`), `n != 1`, `stream: true`. So are the
  fields that ask for something this server cannot do (`check_request`): `previous_response_id`,
  `conversation`, `prompt`, `background`, structured `text.format`. Accepted and ignored: `metadata` (echoed),
  `store`, `user`, `reasoning`, `truncation`, `include`, `max_tool_calls`, `service_tier`, and `tool_choice`
  (echoed; the template always offers every tool, as vLLM does). A missing `input` is a 422.
- Items and content parts: extras ignored (Gym adds `routed_experts`, `logprobs`, ...). An item of another type
  (hosted tool calls, item references, ...) parses as UnsupportedItem and the conversion answers 400 naming it.
"""

import re
import secrets
import time
from collections.abc import Sequence
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Discriminator, Field, Tag

from asyncppo.gym.protocol import (
    Choice,
    FunctionCall,
    RequestMessage,
    ResponseMessage,
    SamplingKnobs,
    TokenFields,
    ToolCall,
)

TEXT_PART_TYPES = ("input_text", "output_text")


class ResponsesInputError(ValueError):
    """The request cannot be served as asked (the server answers 400 with this message)."""


class ContentPart(BaseModel):
    """One part of a message's or a tool output's content; only text parts can be served."""

    model_config = ConfigDict(extra="allow")
    type: str
    text: str | None = None


class MessageItem(TokenFields):
    """A `message` input item: the short form `{role, content}` or an earlier assistant output message."""

    model_config = ConfigDict(extra="ignore")
    type: Literal["message"] = "message"
    role: Literal["user", "system", "developer", "assistant"]
    content: str | list[ContentPart]
    id: str | None = None
    status: str | None = None


class SummaryText(BaseModel):
    model_config = ConfigDict(extra="ignore")
    type: Literal["summary_text"] = "summary_text"
    text: str


class ReasoningItem(TokenFields):
    """A `reasoning` item: the text of the model's `<think>` blocks, one summary part per block."""

    model_config = ConfigDict(extra="ignore")
    type: Literal["reasoning"] = "reasoning"
    id: str | None = None
    summary: list[SummaryText] = Field(default_factory=list)
    content: list[ContentPart] | None = None
    """`reasoning_text` parts, read only when `summary` is empty."""
    encrypted_content: str | None = None


class FunctionCallItem(TokenFields):
    """A `function_call` item; `call_id` is the id the matching `function_call_output` names."""

    model_config = ConfigDict(extra="ignore")
    type: Literal["function_call"] = "function_call"
    call_id: str
    name: str
    arguments: str
    """A JSON string, exactly as the model wrote it (after parsing)."""
    id: str | None = None
    status: str | None = None


class FunctionCallOutputItem(BaseModel):
    """A `function_call_output` item: a tool's answer, sent to the model as a `tool` message."""

    model_config = ConfigDict(extra="ignore")
    type: Literal["function_call_output"] = "function_call_output"
    call_id: str
    output: str | list[ContentPart]
    id: str | None = None
    status: str | None = None


class UnsupportedItem(BaseModel):
    """An item of any other type, kept whole so the server can name it in its 400."""

    model_config = ConfigDict(extra="allow")
    type: str | None = None


_ITEM_TYPES = ("message", "reasoning", "function_call", "function_call_output")


def _item_tag(item: Any) -> str:
    kind = item.get("type") if isinstance(item, dict) else getattr(item, "type", None)
    if kind is None and (item.get("role") if isinstance(item, dict) else getattr(item, "role", None)):
        kind = "message"  # the short form of a message has no type
    return kind if kind in _ITEM_TYPES else "unsupported"


InputItem = Annotated[
    Annotated[MessageItem, Tag("message")]
    | Annotated[ReasoningItem, Tag("reasoning")]
    | Annotated[FunctionCallItem, Tag("function_call")]
    | Annotated[FunctionCallOutputItem, Tag("function_call_output")]
    | Annotated[UnsupportedItem, Tag("unsupported")],
    Discriminator(_item_tag),
]


class ResponsesRequest(SamplingKnobs):
    """POST /v1/responses body (Responses create params); unknown fields: module docstring. The sampling fields
    come from SamplingKnobs; top_k, stop and the penalties are not Responses parameters and are rejected."""

    input: str | list[InputItem]
    model: str | None = None
    """When set, it must be the served model's name."""
    instructions: str | None = None
    """Sent to the model as a leading system message."""
    tools: list[dict[str, Any]] = Field(default_factory=list)
    """Responses-style function tools `{type: "function", name, description, parameters, strict}`."""
    tool_choice: str | dict[str, Any] = "auto"
    parallel_tool_calls: bool = True
    max_output_tokens: int | None = None
    metadata: dict[str, str] | None = None
    previous_response_id: str | None = None
    conversation: str | dict[str, Any] | None = None
    prompt: dict[str, Any] | None = None
    background: bool | None = None
    text: dict[str, Any] | None = None


class OutputText(BaseModel):
    model_config = ConfigDict(extra="ignore")
    type: Literal["output_text"] = "output_text"
    text: str
    annotations: list[Any] = Field(default_factory=list)


class OutputMessage(TokenFields):
    """The assistant `message` output item."""

    model_config = ConfigDict(extra="ignore")
    type: Literal["message"] = "message"
    id: str
    role: Literal["assistant"] = "assistant"
    status: Literal["completed", "incomplete"] = "completed"
    content: list[OutputText]


OutputItem = Annotated[ReasoningItem | OutputMessage | FunctionCallItem, Field(discriminator="type")]


class IncompleteDetails(BaseModel):
    reason: Literal["max_output_tokens"]


class InputTokensDetails(BaseModel):
    cached_tokens: int = 0
    cache_write_tokens: int = 0
    """Required by recent openai-python models; this server has no prompt cache."""


class OutputTokensDetails(BaseModel):
    reasoning_tokens: int = 0


class ResponsesUsage(BaseModel):
    input_tokens: int
    output_tokens: int
    total_tokens: int
    input_tokens_details: InputTokensDetails = Field(default_factory=InputTokensDetails)
    output_tokens_details: OutputTokensDetails = Field(default_factory=OutputTokensDetails)


class ResponsesResponse(BaseModel):
    """POST /v1/responses answer: every field openai-python's `Response` requires, and the echoed request."""

    model_config = ConfigDict(extra="ignore")
    id: str
    object: Literal["response"] = "response"
    created_at: int = Field(default_factory=lambda: int(time.time()))
    model: str
    status: Literal["completed", "incomplete"]
    incomplete_details: IncompleteDetails | None = None
    output: list[OutputItem]
    instructions: str | None = None
    metadata: dict[str, str] | None = None
    parallel_tool_calls: bool
    tool_choice: str | dict[str, Any]
    tools: list[dict[str, Any]]
    temperature: float | None = None
    top_p: float | None = None
    max_output_tokens: int | None = None
    usage: ResponsesUsage


def check_request(request: ResponsesRequest) -> None:
    """ResponsesInputError for a declared field asking for what this server cannot do (see module docstring)."""
    if request.previous_response_id is not None or request.conversation is not None:
        raise ResponsesInputError(
            "previous_response_id and conversation are not supported: this server stores no responses; "
            "send the whole conversation as input"
        )
    if request.prompt is not None:
        raise ResponsesInputError("prompt (a stored prompt template) is not supported; send instructions and input")
    if request.background:
        raise ResponsesInputError("background=true is not supported: responses are answered in the request")
    text_format = (request.text or {}).get("format") or {}
    if text_format.get("type", "text") != "text":
        raise ResponsesInputError(
            f"text.format type {text_format.get('type')!r} is not supported: it needs constrained decoding, which "
            "would change sampling; only 'text' is served"
        )


def chat_tools(tools: Sequence[dict[str, Any]]) -> list[dict[str, Any]] | None:
    """Responses function tools as chat tools `{type: "function", function: {name, description, parameters}}`;
    `strict` is dropped (there is no constrained decoding)."""
    converted = []
    for index, tool in enumerate(tools):
        kind = tool.get("type")
        if kind != "function":
            raise ResponsesInputError(f"tools[{index}]: tool type {kind!r} is not supported, only 'function' is")
        if not isinstance(tool.get("name"), str):
            raise ResponsesInputError(f"tools[{index}]: a function tool needs a string `name`")
        function = {key: tool[key] for key in ("name", "description", "parameters") if tool.get(key) is not None}
        converted.append({"type": "function", "function": function})
    return converted or None


AssistantItem = MessageItem | ReasoningItem | FunctionCallItem
_OUTPUT_ORDER = {"reasoning": 0, "message": 1, "function_call": 2}


def chat_messages(request: ResponsesRequest) -> list[RequestMessage]:
    """The chat conversation of a request: instructions as a leading system message, then the input items
    (grouping rules in the module docstring). ResponsesInputError for items or parts that cannot be served."""
    messages = [RequestMessage(role="system", content=request.instructions)] if request.instructions else []
    if isinstance(request.input, str):
        return [*messages, RequestMessage(role="user", content=request.input)]
    call: list[tuple[str, AssistantItem]] = []  # (where, item) of the model call being assembled
    for index, item in enumerate(request.input):
        where = f"input[{index}]"
        if isinstance(item, UnsupportedItem):
            raise ResponsesInputError(
                f"{where}: item type {item.type!r} is not supported; expected one of {list(_ITEM_TYPES)}"
            )
        if isinstance(item, FunctionCallOutputItem) or (isinstance(item, MessageItem) and item.role != "assistant"):
            messages.extend(_assistant_messages(call))
            call = []
            messages.append(_chat_message(item, where))
            continue
        if call and _OUTPUT_ORDER[item.type] < _OUTPUT_ORDER[call[-1][1].type]:
            messages.extend(_assistant_messages(call))
            call = []
        call.append((where, item))
        if item.has_tokens:  # the last item of its model call
            messages.extend(_assistant_messages(call))
            call = []
    messages.extend(_assistant_messages(call))
    if not messages:
        raise ResponsesInputError("input is empty: nothing to answer")
    return messages


def _chat_message(item: FunctionCallOutputItem | MessageItem, where: str) -> RequestMessage:
    if isinstance(item, FunctionCallOutputItem):
        return RequestMessage(role="tool", tool_call_id=item.call_id, content=_text(item.output, where))
    if item.has_tokens:
        raise ResponsesInputError(f"{where}: a {item.role} message carries token fields; only model output may")
    return RequestMessage(role=item.role, content=_text(item.content, where))


def _assistant_messages(call: Sequence[tuple[str, AssistantItem]]) -> list[RequestMessage]:
    """One model call's items as one assistant message (none for no items); reasoning becomes `<think>` blocks
    ahead of the text, and the token fields come from the item that carries them."""
    if not call:
        return []
    items = [item for _, item in call]
    thoughts = [text for item in items if isinstance(item, ReasoningItem) for text in _reasoning_texts(item)]
    texts = [_text(item.content, where) for where, item in call if isinstance(item, MessageItem)]
    tool_calls = [
        ToolCall(id=item.call_id, function=FunctionCall(name=item.name, arguments=item.arguments))
        for item in items
        if isinstance(item, FunctionCallItem)
    ]
    tokens = next((item for item in items if item.has_tokens), TokenFields())
    message = RequestMessage(
        role="assistant",
        content="".join(f"<think>{thought}</think>" for thought in thoughts) + "\n".join(texts),
        tool_calls=tool_calls or None,
        prompt_token_ids=tokens.prompt_token_ids,
        generation_token_ids=tokens.generation_token_ids,
        generation_log_probs=tokens.generation_log_probs,
    )
    return [message]


def _reasoning_texts(item: ReasoningItem) -> list[str]:
    if item.summary:
        return [part.text for part in item.summary]
    return [part.text or "" for part in item.content or [] if part.type == "reasoning_text"]


def _text(content: str | list[ContentPart], where: str) -> str:
    if isinstance(content, str):
        return content
    for part in content:
        if part.type not in TEXT_PART_TYPES:
            raise ResponsesInputError(
                f"{where}: content part type {part.type!r} is not supported; expected one of {list(TEXT_PART_TYPES)}"
            )
    return "".join(part.text or "" for part in content)


_THINK_BLOCK = re.compile(r"<think>(.*?)</think>", re.DOTALL)


def split_reasoning(content: str) -> tuple[list[str], str]:
    """(text of each `<think>...</think>` block, the rest): both stripped when there is a block, else ([], content).

    An unclosed `<think>` (a generation cut by the length limit) stays in the text.
    """
    thoughts = _THINK_BLOCK.findall(content)
    if not thoughts:
        return [], content
    return [thought.strip() for thought in thoughts], _THINK_BLOCK.sub("", content).strip()


def output_items(message: ResponseMessage, incomplete: bool) -> list[ReasoningItem | OutputMessage | FunctionCallItem]:
    """Output items of one generated message; the token fields go on the last item and cover the whole generation.

    A message item is added when there is text, or when there would be no item at all (an empty generation).
    """
    thoughts, text = split_reasoning(message.content or "")
    calls = message.tool_calls or []
    items: list[ReasoningItem | OutputMessage | FunctionCallItem] = []
    if thoughts:
        items.append(ReasoningItem(id=f"rs_{secrets.token_hex(12)}", summary=[SummaryText(text=t) for t in thoughts]))
    if text or not (thoughts or calls):
        status: Literal["completed", "incomplete"] = "incomplete" if incomplete else "completed"
        items.append(OutputMessage(id=f"msg_{secrets.token_hex(12)}", status=status, content=[OutputText(text=text)]))
    for call in calls:
        items.append(
            FunctionCallItem(
                id=call.id,
                call_id=call.id,
                name=call.function.name,
                arguments=call.function.arguments,
                status="completed",
            )
        )
    tokens = {
        "prompt_token_ids": message.prompt_token_ids,
        "generation_token_ids": message.generation_token_ids,
        "generation_log_probs": message.generation_log_probs,
    }
    items[-1] = items[-1].model_copy(update=tokens)
    return items


def build_response(request: ResponsesRequest, choice: Choice, model_name: str) -> ResponsesResponse:
    """The Responses object of one generation; a length stop is `incomplete` with reason max_output_tokens."""
    message = choice.message
    num_input, num_output = len(message.prompt_token_ids or []), len(message.generation_token_ids or [])
    incomplete = choice.finish_reason == "length"
    return ResponsesResponse(
        id=f"resp_{secrets.token_hex(12)}",
        model=model_name,
        status="incomplete" if incomplete else "completed",
        incomplete_details=IncompleteDetails(reason="max_output_tokens") if incomplete else None,
        output=output_items(message, incomplete),
        instructions=request.instructions,
        metadata=request.metadata,
        parallel_tool_calls=request.parallel_tool_calls,
        tool_choice=request.tool_choice,
        tools=request.tools,
        temperature=request.temperature,
        top_p=request.top_p,
        max_output_tokens=request.max_output_tokens,
        usage=ResponsesUsage(input_tokens=num_input, output_tokens=num_output, total_tokens=num_input + num_output),
    )
