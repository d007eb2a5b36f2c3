"""Pydantic models of the OpenAI-style chat wire format that the policy server serves and the gym code reads.

Shapes: docs/gym-protocol.md, sections Policy server and Token fields. Assistant messages may carry the token
bundle (`prompt_token_ids`, `generation_token_ids`, `generation_log_probs`) in both directions.

Unknown fields, per model:
- ChatCompletionRequest, RequestMessage, ToolCall, FunctionCall: accepted and ignored. OpenAI clients and Gym's
  `vllm_model` send extras (`chat_template_kwargs`, `metadata`, `parallel_tool_calls`, `tool_choice`,
  `reasoning_effort`, `reasoning_content`, `routed_experts`, ...) that must not fail the request. Extras that
  would change the sampled distribution are declared fields instead, so the server can reject them (see
  `OFF_POLICY_KNOBS`) rather than silently sample from something else.
- ChatCompletionResponse and its parts: accepted and ignored, because we also read responses of other servers
  (vLLM adds `stop_reason`, `logprobs`, `system_fingerprint`, ...).
- TokenizeRequest: forbidden (422). Every tokenize option changes the returned ids (`continue_final_message`,
  `add_special_tokens`, ...), so an ignored one would silently return the wrong tokens. The two that Gym's
  fallback path sends, `chat_template_kwargs` and `required_prefix_token_ids`, are declared and honoured.
"""

import time
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

# Sampling options that would take the engine off the (temperature, top_p) profile if honoured, or off the
# client's intent if ignored; the server rejects any that is set to a non-neutral value (name -> neutral values).
OFF_POLICY_KNOBS: dict[str, tuple[object, ...]] = {
    "stop": (None, [], ""),
    "presence_penalty": (None, 0, 0.0),
    "frequency_penalty": (None, 0, 0.0),
    "repetition_penalty": (None, 1, 1.0),
    "min_p": (None, 0, 0.0),
    "logit_bias": (None, {}),
}


class TokenFields(BaseModel):
    """The token bundle of one model call, all three fields or none (validated together)."""

    prompt_token_ids: list[int] | None = None
    """The exact token sequence fed to the engine (after the prefix splice)."""
    generation_token_ids: list[int] | None = None
    """The sampled ids, EOS included when it was sampled."""
    generation_log_probs: list[float] | None = None
    """Logprob of each sampled id under the distribution it was sampled from, floored at -9999.0."""

    @model_validator(mode="after")
    def _check_token_fields(self) -> "TokenFields":
        present = [self.prompt_token_ids is not None, self.generation_token_ids is not None]
        present.append(self.generation_log_probs is not None)
        if any(present) and not all(present):
            raise ValueError(
                "prompt_token_ids, generation_token_ids and generation_log_probs must be given together or not at all"
            )
        generated, logprobs = self.generation_token_ids, self.generation_log_probs
        if generated is not None and logprobs is not None and len(generated) != len(logprobs):
            raise ValueError(
                f"generation_token_ids has {len(generated)} ids but generation_log_probs has {len(logprobs)} values"
            )
        return self

    @property
    def has_tokens(self) -> bool:
        """True when the message carries the token bundle (an output of the policy server)."""
        return self.prompt_token_ids is not None


class FunctionCall(BaseModel):
    """The function of a tool call; `arguments` is a JSON string, as on the OpenAI wire."""

    model_config = ConfigDict(extra="ignore")
    name: str
    arguments: str


class ToolCall(BaseModel):
    """One tool call of an assistant message."""

    model_config = ConfigDict(extra="ignore")
    id: str
    type: Literal["function"] = "function"
    function: FunctionCall


class RequestMessage(TokenFields):
    """One chat message of a request; only assistant messages may carry the token bundle."""

    model_config = ConfigDict(extra="ignore")
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[dict[str, Any]] | None = None
    """A string or a list of OpenAI content parts (the template renders the `text` parts)."""
    tool_calls: list[ToolCall] | None = None
    tool_call_id: str | None = None

    @model_validator(mode="after")
    def _tokens_only_on_assistant(self) -> "RequestMessage":
        if self.has_tokens and self.role != "assistant":
            raise ValueError(f"a {self.role} message carries token fields; only assistant messages may")
        return self


class SamplingKnobs(BaseModel):
    """Sampling fields of both request kinds. The server checks them (`check_sampling`), not the model, so a
    wrong profile gets the 400 body of docs/gym-protocol.md, Sampling and error bodies, instead of a 422; the
    off-policy ones are declared only so that they can be rejected (see OFF_POLICY_KNOBS)."""

    model_config = ConfigDict(extra="ignore")
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    """Must be unset or -1: the profile fixes the sampling distribution."""
    top_logprobs: int | None = None
    n: int = 1
    stream: bool = False
    stop: str | list[str] | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    repetition_penalty: float | None = None
    min_p: float | None = None
    logit_bias: dict[str, float] | None = None


class ChatCompletionRequest(SamplingKnobs):
    """POST /v1/chat/completions body."""

    model: str
    messages: list[RequestMessage] = Field(min_length=1)
    tools: list[dict[str, Any]] | None = None
    max_tokens: int | None = None
    max_completion_tokens: int | None = None
    """The newer OpenAI name of max_tokens; the smaller of the two wins when both are set."""
    logprobs: bool = False
    return_tokens_as_token_ids: bool = False
    required_prefix_token_ids: list[int] | None = None
    """Exact tokens the prompt must start with; by default the last token-carrying message's prompt + generation."""
    chat_template_kwargs: dict[str, Any] | None = None
    """Extra variables for the chat template (e.g. `enable_thinking`), as vLLM takes them."""


class ResponseMessage(TokenFields):
    """choices[0].message of a response: text, parsed tool calls and the token bundle."""

    model_config = ConfigDict(extra="ignore")
    role: Literal["assistant"] = "assistant"
    content: str | None = None
    tool_calls: list[ToolCall] | None = None


class Choice(BaseModel):
    """One completion; the policy server always returns exactly one."""

    model_config = ConfigDict(extra="ignore")
    index: int = 0
    message: ResponseMessage
    finish_reason: Literal["stop", "length", "tool_calls"]


class Usage(BaseModel):
    """Token counts of one call."""

    model_config = ConfigDict(extra="ignore")
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class ChatCompletionResponse(BaseModel):
    """POST /v1/chat/completions answer."""

    model_config = ConfigDict(extra="ignore")
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    choices: list[Choice] = Field(min_length=1)
    usage: Usage


class TokenizeRequest(BaseModel):
    """POST /tokenize body (root path): either a plain `prompt` or the chat form (`messages`, `tools`)."""

    model_config = ConfigDict(extra="forbid")
    model: str | None = None
    prompt: str | None = None
    messages: list[RequestMessage] | None = Field(None, min_length=1)
    tools: list[dict[str, Any]] | None = None
    add_generation_prompt: bool = True
    """Chat form only: end with the assistant header, as a chat completion prompt does."""
    chat_template_kwargs: dict[str, Any] | None = None
    """Chat form only: extra variables for the chat template, as on chat completions."""
    required_prefix_token_ids: list[int] | None = None
    """Chat form only: the prompt is spliced onto these ids exactly as a chat completion's is (so the answer is
    that completion's prompt), which needs add_generation_prompt."""
    add_special_tokens: bool = False
    """Prompt form only: let the tokenizer add its BOS/EOS (off, as the chat template adds its own)."""

    @model_validator(mode="after")
    def _one_form(self) -> "TokenizeRequest":
        if (self.prompt is None) == (self.messages is None):
            raise ValueError("give exactly one of `prompt` and `messages`")
        if self.prompt is not None and (self.chat_template_kwargs, self.required_prefix_token_ids) != (None, None):
            raise ValueError("chat_template_kwargs and required_prefix_token_ids apply to the chat form (`messages`)")
        if self.required_prefix_token_ids is not None and not self.add_generation_prompt:
            raise ValueError(
                "required_prefix_token_ids splices the prompt of the next assistant turn: it needs "
                "add_generation_prompt=true"
            )
        return self


class TokenizeResponse(BaseModel):
    """POST /tokenize answer (vLLM shape)."""

    tokens: list[int]
    count: int
    max_model_len: int
