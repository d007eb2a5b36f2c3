"""The policy HTTP server: an OpenAI-compatible FastAPI app in front of a Generator, plus a uvicorn runner.

Gym agents (through Gym's `vllm_model`) call it for every model turn; the trainer or `asyncppo gym serve`
starts it. Contract: docs/gym-protocol.md, sections Policy server and Sampling and error bodies. Every POST body
is parsed strictly (`request_body.parse_body`), so malformed or hostile input is a 4xx naming the field.

    POST /v1/chat/completions --> check sampling profile --> ChatEngine.complete:
         build_prompt (prefix splice) --> Generator.submit --> parse_generation
         <-- message {content, tool_calls, prompt_token_ids, generation_token_ids, generation_log_probs}
    POST /v1/responses --> check sampling profile --> responses_conversion.chat_messages --> ChatEngine.complete
         <-- responses_conversion.build_response: output items, the token fields on the last one

Work that grows with the body (JSON parsing, chat templating, tokenising, decoding, building the answer) runs on
a small thread pool, so the event loop stays free for `/health` and for other requests while large ones are
served; the runner (`PolicyServer`, in `policy_server_runner.py`) caps bodies and bounds each request's time
(`request_limits.py`).
"""

import asyncio
import contextlib
import functools
import math
import secrets
import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from fastapi import FastAPI, Request, Response
from fastapi.responses import JSONResponse
from pydantic import BaseModel
from starlette.exceptions import HTTPException
from transformers import PreTrainedTokenizerBase

from asyncppo.generation.protocol import GenerationRequest, GenerationResult, GeneratorClosedError, SamplingParams
from asyncppo.generation.protocol import Generator as GeneratorProtocol
from asyncppo.gym.auth import require_api_key, warn_if_unauthenticated
from asyncppo.gym.chat_prompt import PromptError, build_prompt, encode_text, parse_generation, render_tokens
from asyncppo.gym.protocol import (
    OFF_POLICY_KNOBS,
    ChatCompletionRequest,
    ChatCompletionResponse,
    Choice,
    RequestMessage,
    ResponseMessage,
    SamplingKnobs,
    TokenizeRequest,
    TokenizeResponse,
    Usage,
)
from asyncppo.gym.request_body import RequestError, error_response, parse_body
from asyncppo.gym.responses import ResponsesInputError, ResponsesRequest, ResponsesResponse, check_request
from asyncppo.gym.responses_conversion import build_response, chat_messages, chat_tools
from asyncppo.types import SamplingProfile

LOGPROB_FLOOR = -9999.0
"""Logprobs below this (and -inf) are reported as it, so the JSON never carries -Infinity."""
CPU_THREADS = 2
"""Threads of a policy server's body work. Two, so one huge request does not hold up every other one's prompt;
not more, because the GIL-holding parts of that work (JSON parsing, building id lists, template rendering) then
queue the event loop behind several threads at once (measured with scripts/bench_policy_server.py: /health p99
17 / 78 / 168 ms with 1 / 2 / 4 threads while 20 one-MiB requests were served on 2 busy cores)."""

Result = TypeVar("Result")


async def off_loop(executor: ThreadPoolExecutor, function: Callable[..., Result], *args: Any, **kwargs: Any) -> Result:
    """`function(*args, **kwargs)` run on `executor`, awaited; its exceptions (RequestError) propagate."""
    return await asyncio.get_running_loop().run_in_executor(executor, functools.partial(function, *args, **kwargs))


def json_response(model: BaseModel, *, exclude_none: bool) -> Response:
    """The JSON answer FastAPI would serialize for `model` (by alias), built by the caller's thread."""
    return Response(model.model_dump_json(by_alias=True, exclude_none=exclude_none), media_type="application/json")


def check_sampling(request: SamplingKnobs, train: SamplingProfile, validation: SamplingProfile) -> None:
    """RequestError(400) unless the request samples exactly as the train or the validation profile does.

    Agents issue their own requests, so this is the one place that keeps sampling on-policy.
    """
    if request.top_k is not None and request.top_k != -1:
        raise RequestError(400, f"top_k={request.top_k} is not allowed: leave it unset or -1")
    for name, neutral in OFF_POLICY_KNOBS.items():
        if getattr(request, name) not in neutral:
            raise RequestError(400, f"{name}={getattr(request, name)!r} is not supported: it would change sampling")
    if request.n != 1 or request.stream:
        raise RequestError(400, f"only n=1 without streaming is served, got n={request.n}, stream={request.stream}")
    if request.top_logprobs:
        raise RequestError(400, f"top_logprobs={request.top_logprobs} is not served; use 0 or leave it unset")
    profiles = f"train (temperature, top_p) = {train}, validation = {validation}"
    if request.temperature is None or request.top_p is None:
        raise RequestError(400, f"temperature and top_p must both be set explicitly to a profile: {profiles}")
    pair = SamplingProfile(request.temperature, request.top_p)
    if pair not in (train, validation):
        raise RequestError(400, f"(temperature, top_p) = {pair} matches no sampling profile: {profiles}")


def output_budget(limits: Mapping[str, int | None], num_prompt_tokens: int, max_model_len: int) -> int:
    """The output limits (request field name -> value, unset = None) clamped so prompt + output <= max_model_len;
    RequestError(400) for a prompt with no room or a limit below 1."""
    room = max_model_len - num_prompt_tokens
    if room < 1:
        raise RequestError(
            400,
            f"This model's maximum context length is {max_model_len} tokens, but the prompt has "
            f"{num_prompt_tokens} tokens, which leaves no room to generate",
        )
    for name, limit in limits.items():
        if limit is not None and limit < 1:
            raise RequestError(400, f"{name} must be >= 1, got {limit}")
    return min([room, *(limit for limit in limits.values() if limit is not None)])


class ChatEngine:
    """The generation path both routes share: chat messages in, one assistant message with its token bundle out."""

    def __init__(
        self,
        generator: GeneratorProtocol,
        tokenizer: PreTrainedTokenizerBase,
        eos_token_id: int,
        max_model_len: int,
        executor: ThreadPoolExecutor,
    ) -> None:
        self._generator = generator
        self._tokenizer = tokenizer
        self._eos_token_id = eos_token_id
        self._max_model_len = max_model_len
        self._executor = executor

    async def complete(
        self,
        messages: Sequence[RequestMessage],
        tools: list[dict[str, Any]] | None,
        *,
        profile: SamplingProfile,
        limits: Mapping[str, int | None],
        required_prefix_token_ids: Sequence[int] | None = None,
        template_kwargs: Mapping[str, Any] | None = None,
    ) -> Choice:
        """Splice the prompt, generate under a checked `profile`, parse the text; RequestError on a refusal.

        Templating and decoding run on the executor; the Generator's future is awaited on the loop, so concurrent
        requests queue together and share the engine's batches.
        """
        prompt, budget = await off_loop(
            self._executor, self._prompt, messages, tools, limits, required_prefix_token_ids, template_kwargs
        )
        sampling = SamplingParams.for_profile(profile, max_new_tokens=budget)
        try:
            result = await asyncio.wrap_future(self._generator.submit(GenerationRequest(tuple(prompt), sampling)))
        except GeneratorClosedError as error:
            raise RequestError(503, f"the generation engine is closed: {error}") from error
        except ValueError as error:  # the engine's own request checks (token ids outside the vocabulary, ...)
            raise RequestError(400, str(error)) from error
        return await off_loop(self._executor, self._choice, prompt, result)

    def _prompt(
        self,
        messages: Sequence[RequestMessage],
        tools: list[dict[str, Any]] | None,
        limits: Mapping[str, int | None],
        required_prefix_token_ids: Sequence[int] | None,
        template_kwargs: Mapping[str, Any] | None,
    ) -> tuple[list[int], int]:
        """(prompt ids, output budget); RequestError(400) for messages without a prompt or a prompt with no room."""
        try:
            prompt = build_prompt(
                self._tokenizer, messages, tools, self._eos_token_id, required_prefix_token_ids, template_kwargs
            )
        except PromptError as error:
            raise RequestError(400, str(error)) from error
        try:
            return prompt, output_budget(limits, len(prompt), self._max_model_len)
        except RequestError:
            # The error's traceback keeps this frame, and so the ids, alive until the event loop has answered it:
            # free a prompt of a million ids here, off the loop.
            prompt.clear()
            raise

    def _choice(self, prompt: list[int], result: GenerationResult) -> Choice:
        """The assistant message of `result`: text decoded and parsed into content and tool calls, token fields."""
        generated = list(result.token_ids)
        ends_with_eos = bool(generated) and generated[-1] == self._eos_token_id
        text = self._tokenizer.decode(generated[:-1] if ends_with_eos else generated, skip_special_tokens=False)
        assert isinstance(text, str)  # one sequence in, one string out
        content, tool_calls = parse_generation(text)
        finish_reason = "length" if result.finish_reason == "length" else ("tool_calls" if tool_calls else "stop")
        message = ResponseMessage(
            content=content,
            tool_calls=tool_calls or None,
            prompt_token_ids=prompt,
            generation_token_ids=generated,
            generation_log_probs=[_floored(logprob) for logprob in result.logprobs],
        )
        return Choice(message=message, finish_reason=finish_reason)


def create_policy_app(
    generator: GeneratorProtocol,
    tokenizer: PreTrainedTokenizerBase,
    *,
    model_name: str,
    train_sampling: SamplingProfile,
    validation_sampling: SamplingProfile,
    max_model_len: int,
    api_key: str | None,
) -> FastAPI:
    """The FastAPI app serving `generator` under `model_name` (routes: docs/gym-protocol.md, Policy server).

    Handlers never block the event loop: body work runs on a pool of CPU_THREADS and the engine's future is
    awaited, so concurrent HTTP requests are queued together and share the engine's batches. `api_key` (when
    set) is required as `Authorization: Bearer <key>` on every route but GET /health (readiness probes carry no
    key); without it, each server start prints one warning line.
    One function past 60 lines on purpose: its routes are closures over the one ChatEngine and model card, and
    the work of each lives in named functions (`check_sampling`, `ChatEngine.complete`, the response builders).
    """
    eos_token_id = tokenizer.eos_token_id
    if not isinstance(eos_token_id, int):
        raise ValueError("the tokenizer has no eos_token_id; the prefix splice counts end-of-turn tokens with it")
    if max_model_len < 2:
        raise ValueError(f"max_model_len={max_model_len} must be >= 2")
    executor = ThreadPoolExecutor(CPU_THREADS, thread_name_prefix=f"policy-server-{model_name}")
    engine = ChatEngine(generator, tokenizer, eos_token_id, max_model_len, executor)

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        warn_if_unauthenticated(api_key, f"the policy server of model {model_name!r}")
        yield
        executor.shutdown(wait=False, cancel_futures=True)  # a thread still tokenising is abandoned, not awaited

    app = FastAPI(title=f"asyncppo policy server ({model_name})", lifespan=lifespan)

    @app.exception_handler(RequestError)
    async def _request_error(_: Request, error: RequestError) -> JSONResponse:
        return error_response(error.status, error.message, error.param)

    @app.exception_handler(HTTPException)
    async def _http_error(_: Request, error: HTTPException) -> JSONResponse:  # unknown route, wrong method
        return error_response(error.status_code, str(error.detail))

    require_api_key(app, api_key)

    @app.get("/health")
    async def health() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/v1/models")
    async def models() -> dict[str, object]:
        card = {"id": model_name, "object": "model", "owned_by": "asyncppo", "max_model_len": max_model_len}
        return {"object": "list", "data": [card]}

    @app.post("/tokenize", response_model=TokenizeResponse)
    async def tokenize(request: Request) -> Response:
        return await off_loop(executor, tokenize_body, tokenizer, await request.body(), eos_token_id, max_model_len)

    def check_model(requested: str | None) -> None:
        if requested is not None and requested != model_name:
            raise RequestError(404, f"model {requested!r} is not served here; this server serves {model_name!r}")

    @app.post("/v1/chat/completions", response_model=ChatCompletionResponse, response_model_exclude_none=True)
    async def chat_completions(request: Request) -> Response:
        body = await off_loop(executor, parse_body, ChatCompletionRequest, await request.body())
        check_model(body.model)
        check_sampling(body, train_sampling, validation_sampling)
        assert body.temperature is not None and body.top_p is not None  # check_sampling requires both
        choice = await engine.complete(
            body.messages,
            body.tools,
            profile=SamplingProfile(body.temperature, body.top_p),
            limits={"max_tokens": body.max_tokens, "max_completion_tokens": body.max_completion_tokens},
            required_prefix_token_ids=body.required_prefix_token_ids,
            template_kwargs=body.chat_template_kwargs,
        )
        answer = functools.partial(chat_completion_response, choice, model_name)
        return await off_loop(executor, lambda: json_response(answer(), exclude_none=True))

    @app.post("/v1/responses", response_model=ResponsesResponse, response_model_exclude_none=True)
    async def responses(request: Request) -> Response:
        body = await off_loop(executor, parse_body, ResponsesRequest, await request.body())
        check_model(body.model)
        check_sampling(body, train_sampling, validation_sampling)
        assert body.temperature is not None and body.top_p is not None  # check_sampling requires both
        messages, tools = await off_loop(executor, responses_chat_input, body)
        choice = await engine.complete(
            messages,
            tools,
            profile=SamplingProfile(body.temperature, body.top_p),
            limits={"max_output_tokens": body.max_output_tokens},
        )
        return await off_loop(
            executor, lambda: json_response(build_response(body, choice, model_name), exclude_none=True)
        )

    return app


def responses_chat_input(body: ResponsesRequest) -> tuple[list[RequestMessage], list[dict[str, Any]] | None]:
    """The chat messages and tools of a Responses request; RequestError(400) for input the conversion refuses."""
    try:
        check_request(body)
        return chat_messages(body), chat_tools(body.tools)
    except ResponsesInputError as error:
        raise RequestError(400, str(error)) from error


def tokenize_body(tokenizer: PreTrainedTokenizerBase, raw: bytes, eos_token_id: int, max_model_len: int) -> Response:
    """The answer of POST /tokenize to the body `raw`: the chat form's ids (`tokenize_chat`) or the prompt's."""
    body = parse_body(TokenizeRequest, raw)
    if body.messages is not None:
        tokens = tokenize_chat(tokenizer, body, eos_token_id)
    else:
        assert body.prompt is not None
        tokens = encode_text(tokenizer, body.prompt, body.add_special_tokens)
    return json_response(
        TokenizeResponse(tokens=tokens, count=len(tokens), max_model_len=max_model_len), exclude_none=False
    )


def chat_completion_response(choice: Choice, model_name: str) -> ChatCompletionResponse:
    """The chat completion object of one generation, its usage counted from the choice's token fields."""
    num_prompt = len(choice.message.prompt_token_ids or [])
    num_output = len(choice.message.generation_token_ids or [])
    return ChatCompletionResponse(
        id=f"chatcmpl-{secrets.token_hex(12)}",
        created=int(time.time()),
        model=model_name,
        choices=[choice],
        usage=Usage(prompt_tokens=num_prompt, completion_tokens=num_output, total_tokens=num_prompt + num_output),
    )


def tokenize_chat(tokenizer: PreTrainedTokenizerBase, body: TokenizeRequest, eos_token_id: int) -> list[int]:
    """The chat form's ids: with `required_prefix_token_ids`, the prompt a chat completion of the same messages
    would be given (the prefix splice, which starts with those ids); otherwise the template's rendering."""
    assert body.messages is not None
    try:
        if body.required_prefix_token_ids is None:
            return render_tokens(
                tokenizer, body.messages, body.tools, body.add_generation_prompt, body.chat_template_kwargs
            )
        prefix = body.required_prefix_token_ids
        tokens = build_prompt(tokenizer, body.messages, body.tools, eos_token_id, prefix, body.chat_template_kwargs)
    except PromptError as error:
        raise RequestError(400, str(error)) from error
    if tokens[: len(prefix)] != prefix:  # the splice guarantees it; checked because the caller relies on it
        raise RequestError(
            400, f"required_prefix_token_ids: the rendered prompt does not start with them, got {tokens[:16]}..."
        )
    return tokens


def _floored(logprob: float) -> float:
    return LOGPROB_FLOOR if math.isinf(logprob) or logprob < LOGPROB_FLOOR else logprob
