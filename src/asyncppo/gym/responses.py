"""The OpenAI Responses API of the policy server: its wire models, and the check of what a request asks for.

`policy_server.py` parses `POST /v1/responses` bodies into these and `check_request`s them; the conversion of
items to chat messages and back lives in `responses_conversion.py` (docs/gym-protocol.md, Policy server).

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

import time
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Discriminator, Field, Tag

from asyncppo.gym.protocol import SamplingKnobs, TokenFields

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


ITEM_TYPES = ("message", "reasoning", "function_call", "function_call_output")
"""Input item types with a model of their own; any other parses as UnsupportedItem."""


def _item_tag(item: Any) -> str:
    kind = item.get("type") if isinstance(item, dict) else getattr(item, "type", None)
    if kind is None and (item.get("role") if isinstance(item, dict) else getattr(item, "role", None)):
        kind = "message"  # the short form of a message has no type
    return kind if kind in ITEM_TYPES else "unsupported"


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
