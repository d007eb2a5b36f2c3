"""Responses items to chat messages and back: what Gym's `vllm_model` proxy does in front of a chat server,
done in-process for the policy server's `POST /v1/responses` (docs/gym-protocol.md, Policy server).

`policy_server.py` calls `chat_messages` / `chat_tools` on a parsed request (wire models: `responses.py`) and
`build_response` on the generated choice; generation itself is the chat completions path.

    ResponsesRequest{instructions, input items, tools}
      --chat_messages / chat_tools--> [system, user, assistant{"<think>..</think>text", tool_calls, tokens}, tool]
      --policy server: prefix splice, generate--> ResponseMessage{content, tool_calls, tokens}
      --output_items--> [reasoning?, message?, function_call*]    the token fields ride on the LAST item only

One model call = one assistant chat message. Consecutive `reasoning`, assistant `message` and `function_call`
items are one call; the call ends at any other item, after an item carrying the token fields (the last item of
a call), or where an item comes before the previous one in output order (reasoning, message, function_call).
"""

import re
import secrets
from collections.abc import Sequence
from typing import Any, Literal

from asyncppo.gym.protocol import Choice, FunctionCall, RequestMessage, ResponseMessage, TokenFields, ToolCall
from asyncppo.gym.responses import (
    ITEM_TYPES,
    TEXT_PART_TYPES,
    ContentPart,
    FunctionCallItem,
    FunctionCallOutputItem,
    IncompleteDetails,
    MessageItem,
    OutputMessage,
    OutputText,
    ReasoningItem,
    ResponsesInputError,
    ResponsesRequest,
    ResponsesResponse,
    ResponsesUsage,
    SummaryText,
    UnsupportedItem,
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
                f"{where}: item type {item.type!r} is not supported; expected one of {list(ITEM_TYPES)}"
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
