"""The built-in `simple_agent` (docs/gym-protocol.md, Agent server): `POST /run` plays one rollout of a dataset row.

Run by `servers/launch.py`; called by GymClient. It talks Chat Completions straight to the policy server (no
Responses-API proxy in between) and returns the verify response in the shape `gym/results.py` converts:

    POST /run(row) --> resources /seed_session (cookie C)
      loop: policy /v1/chat/completions(history with token fields) --> items (token fields on the turn's last)
            tool calls --> resources /<tool> (cookie C) --> tool messages
      until a turn calls no tool, stops on length, outgrows the context (the policy server's 400
      "context length": a graceful stop) or max_steps --> resources /verify(row + response, C)

With `api_key` set, `/run` requires it (the agent spends the policy server's key on the caller's behalf) and the
agent sends it to the policy and resources servers.
"""

import json
import re
import secrets
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import httpx
from fastapi import FastAPI
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict

from asyncppo.gym.auth import bearer_headers, require_api_key
from asyncppo.gym.results import quote
from asyncppo.gym.servers.least_loaded import LeastLoaded

# Routes of the resources server itself, which a model-chosen tool name must never reach.
RESERVED_TOOL_NAMES = frozenset({"seed_session", "verify", "aggregate_metrics", "mcp", "health"})
_TOOL_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_-]*")
# A policy server's 400 for a prompt over the context (docs/gym-protocol.md, Sampling and error bodies) contains
# this phrase.
CONTEXT_FULL = "context length"


class RunRequest(BaseModel):
    """A dataset row; task and bookkeeping fields ride along as extras and reach /seed_session and /verify."""

    model_config = ConfigDict(extra="allow")
    responses_create_params: dict[str, Any]


class UpstreamError(Exception):
    """A model or resources server answered a call the rollout cannot go on without with an error."""


def chat_completions_url(model_base_url: str) -> str:
    """The chat completions URL for an OpenAI base URL (`http://host:port/v1`) or a server root."""
    base = model_base_url.rstrip("/")
    return f"{base}/chat/completions" if base.endswith("/v1") else f"{base}/v1/chat/completions"


def chat_tools(tools: object) -> list[dict[str, Any]] | None:
    """Responses-style tools (`{type, name, parameters}`) as Chat Completions tools (`{type, function}`)."""
    if not isinstance(tools, list) or not tools:
        return None
    converted = []
    for tool in tools:
        if isinstance(tool, dict) and "function" not in tool:
            function = {key: value for key, value in tool.items() if key != "type"}
            tool = {"type": "function", "function": function}
        converted.append(tool)
    return converted


def chat_messages(responses_input: object) -> list[dict[str, Any]]:
    """The row's `input` (a string or a list of role/content messages) as chat messages with text content."""
    if isinstance(responses_input, str):
        return [{"role": "user", "content": responses_input}]
    if not isinstance(responses_input, list) or not responses_input:
        raise ValueError(f"responses_create_params.input: need a string or a non-empty list: {quote(responses_input)}")
    messages = []
    for message in responses_input:
        if not isinstance(message, dict) or "role" not in message:
            raise ValueError(f"responses_create_params.input: not a role/content message: {quote(message)}")
        content = message.get("content")
        if isinstance(content, list):
            content = "".join(str(part.get("text", "")) for part in content if isinstance(part, dict))
        messages.append({"role": message["role"], "content": content or ""})
    return messages


def turn_items(message: dict[str, Any]) -> list[dict[str, Any]]:
    """Responses output items of one assistant turn; the token fields go on the last one (results.py: one per turn)."""
    items: list[dict[str, Any]] = []
    content = message.get("content") or ""
    tool_calls = message.get("tool_calls") or []
    if content or not tool_calls:
        text_part = {"type": "output_text", "text": content, "annotations": []}
        items.append(
            {"type": "message", "id": f"msg_{secrets.token_hex(8)}", "role": "assistant", "status": "completed"}
            | {"content": [text_part]}
        )
    for call in tool_calls:
        function = call["function"]
        items.append(
            {"type": "function_call", "id": f"fc_{secrets.token_hex(8)}", "call_id": call["id"], "status": "completed"}
            | {"name": function["name"], "arguments": function["arguments"]}
        )
    for field in ("prompt_token_ids", "generation_token_ids", "generation_log_probs"):
        items[-1][field] = message.get(field)
    return items


@dataclass(frozen=True)
class SimpleAgent:
    """One rollout of a row against a policy server and a resources server: the model / tool loop of `/run`."""

    model_name: str
    max_steps: int
    resources_url: str
    """Without a trailing slash."""

    async def rollout(
        self,
        http: httpx.AsyncClient,
        model_url: str,
        row: dict[str, Any],
        messages: list[dict[str, Any]],
        session: dict[str, str],
    ) -> dict[str, Any]:
        """The Responses object of the rollout: model turns and tool calls until a turn calls no tool, stops on
        length, outgrows the context or max_steps is reached (module docstring)."""
        params = row["responses_create_params"]
        request = {"model": self.model_name, "tools": chat_tools(params.get("tools")), "logprobs": True}
        request |= {"temperature": params.get("temperature"), "top_p": params.get("top_p")}
        request |= {"max_tokens": params.get("max_output_tokens"), "return_tokens_as_token_ids": True}
        output: list[dict[str, Any]] = []
        usage = {"input_tokens": 0, "output_tokens": 0, "total_tokens": 0}
        incomplete = None
        for _ in range(self.max_steps):
            reply = await _post(http, model_url, request | {"messages": messages}, tolerated_400=CONTEXT_FULL)
            if reply.status_code == 400:
                # The conversation outgrew the context: a graceful stop, as Gym's model server makes it.
                incomplete = {"reason": "max_output_tokens"}
                break
            answer = reply.json()
            choice = answer["choices"][0]
            message = choice["message"]
            usage["input_tokens"] += answer["usage"]["prompt_tokens"]
            usage["output_tokens"] += answer["usage"]["completion_tokens"]
            output.extend(turn_items(message))
            # The assistant message goes back with its token fields, so the server splices the exact tokens.
            messages.append({**message, "role": "assistant"})
            if choice["finish_reason"] == "length":
                incomplete = {"reason": "max_output_tokens"}
                break
            if not message.get("tool_calls"):
                break
            for call in message["tool_calls"]:
                tool_output = await self.call_tool(http, call["function"], session)
                output.append({"type": "function_call_output", "call_id": call["id"], "output": tool_output})
                messages.append({"role": "tool", "tool_call_id": call["id"], "content": tool_output})
        usage["total_tokens"] = usage["input_tokens"] + usage["output_tokens"]
        return {
            "id": f"resp_{secrets.token_hex(12)}",
            "object": "response",
            "model": self.model_name,
            "status": "incomplete" if incomplete else "completed",
            "incomplete_details": incomplete,
            "output": output,
            "usage": usage,
        }

    async def call_tool(self, http: httpx.AsyncClient, function: dict[str, Any], session: dict[str, str]) -> str:
        """The tool's raw answer text, whatever its status: the model reads errors instead of the rollout failing."""
        name = function["name"]
        if not _TOOL_NAME.fullmatch(name) or name in RESERVED_TOOL_NAMES:
            return json.dumps({"error": f"Unknown tool {name!r}"})
        try:
            arguments = json.loads(function["arguments"])
        except json.JSONDecodeError as error:
            return json.dumps({"error": f"Invalid tool call arguments: {error}"})
        if not isinstance(arguments, dict):
            return json.dumps({"error": f"Invalid tool call arguments: not a JSON object: {quote(arguments)}"})
        try:
            answer = await http.post(f"{self.resources_url}/{name}", json=arguments, headers=session)
        except httpx.TransportError as error:
            raise UpstreamError(f"tool {name!r}: {type(error).__name__}: {error}") from error
        return answer.text


def create_simple_agent_app(
    model_base_url: str | Sequence[str],
    resources_url: str,
    *,
    model_name: str,
    max_steps: int,
    api_key: str | None = None,
) -> FastAPI:
    """The agent app; every rollout uses `model_name` on a policy server and tools of `resources_url`.

    `api_key` (when set) is required as `Authorization: Bearer <key>` on every route but GET /health, and sent to
    the policy and resources servers, which require the same key.

    With several policy servers (one per generator worker) each rollout sticks to one of them, so its turns reach
    the same engine (Gym's sticky sessions): the one with the fewest of this agent's rollouts running on it, so
    long rollouts on one engine do not pile new ones onto it.
    """
    if max_steps < 1:
        raise ValueError(f"max_steps must be >= 1, got {max_steps}")
    base_urls = [model_base_url] if isinstance(model_base_url, str) else list(model_base_url)
    if not base_urls:
        raise ValueError("model_base_url: need at least one policy server URL")
    agent = SimpleAgent(model_name, max_steps, resources_url.rstrip("/"))
    model_urls = LeastLoaded([chat_completions_url(url) for url in base_urls])
    auth = bearer_headers(api_key)
    app = FastAPI(title="asyncppo simple_agent")
    require_api_key(app, api_key)

    @app.get("/health")
    async def health() -> dict[str, str]:
        return {"status": "ok"}

    @app.post("/run", response_model=None)
    async def run(body: RunRequest) -> dict[str, Any] | JSONResponse:
        row = body.model_dump()
        try:
            messages = chat_messages(body.responses_create_params.get("input"))
        except ValueError as error:
            return JSONResponse({"error": str(error)}, 422)
        # One client per rollout, no transport timeout: the caller's deadline bounds the rollout.
        async with httpx.AsyncClient(timeout=None, headers=auth) as http:
            try:
                seed = await _post(http, f"{agent.resources_url}/seed_session", row)
                cookie = "; ".join(f"{name}={value}" for name, value in seed.cookies.items())
                session = {"Cookie": cookie} if cookie else {}
                with model_urls.lease() as model_url:
                    response = await agent.rollout(http, model_url, row, messages, session)
                verified = await _post(http, f"{agent.resources_url}/verify", row | {"response": response}, session)
            except UpstreamError as error:
                return JSONResponse({"error": str(error)}, 502)
        return verified.json()

    return app


async def _post(
    http: httpx.AsyncClient,
    url: str,
    body: dict[str, Any],
    headers: dict[str, str] | None = None,
    tolerated_400: str | None = None,
) -> httpx.Response:
    """The answer of a 200, or of a 400 whose body contains `tolerated_400`; UpstreamError otherwise."""
    try:
        answer = await http.post(url, json=body, headers=headers)
    except httpx.TransportError as error:
        raise UpstreamError(f"POST {url}: {type(error).__name__}: {error}") from error
    if answer.status_code == 400 and tolerated_400 is not None and tolerated_400 in answer.text:
        return answer
    if answer.status_code != 200:
        raise UpstreamError(f"POST {url} answered {answer.status_code}: {quote(answer.text)}")
    return answer
