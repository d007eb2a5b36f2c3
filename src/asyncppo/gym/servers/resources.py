"""Built-in resources servers: `math`, `weather`, `session_counter` and `multi_step` (FastAPI).

Contract: docs/gym-protocol.md, Resources servers.

Each serves `POST /seed_session` (answers `{}` and sets the session cookie), `POST /verify` (echoes the request
and adds `reward`) and one `POST /<tool_name>` per tool. The simple agent (`servers/agent.py`) calls them;
`servers/launch.py` runs them. Verify ends the session: its state is dropped once the reward is known. With
`api_key` set, every route but GET /health requires it.
"""

import re
import secrets
import zlib
from collections.abc import Callable, Mapping
from typing import Any

from fastapi import FastAPI, Request, Response
from fastapi.responses import JSONResponse

from asyncppo.gym.auth import require_api_key

SESSION_COOKIE = "asyncppo_session"
_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")

WEATHER_TOOLS = [
    {
        "type": "function",
        "name": "get_weather",
        "description": "The forecast for a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    }
]
SESSION_COUNTER_TOOLS = [
    {
        "type": "function",
        "name": "increment",
        "description": "Add one to the counter and return the new count.",
        "parameters": {"type": "object", "properties": {}},
    }
]
WEATHER_CONDITIONS = ("sunny", "cloudy", "rainy", "windy", "foggy")
MULTI_STEP_TOOLS = [
    {
        "type": "function",
        "name": name,
        "description": description,
        "parameters": {
            "type": "object",
            "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
            "required": ["a", "b"],
        },
    }
    for name, description in (
        ("add", "The sum a + b of two integers."),
        ("multiply", "The product a * b of two integers."),
    )
]


class Sessions:
    """Per-session state, keyed by the session cookie that `seed` sets; one dict of state per session."""

    def __init__(self) -> None:
        self._states: dict[str, dict[str, Any]] = {}

    def seed(self, response: Response, state: dict[str, Any]) -> None:
        session_id = secrets.token_hex(16)
        self._states[session_id] = state
        response.set_cookie(SESSION_COOKIE, session_id, httponly=True)

    def get(self, request: Request) -> dict[str, Any] | None:
        return self._states.get(request.cookies.get(SESSION_COOKIE, ""))

    def end(self, request: Request) -> dict[str, Any] | None:
        return self._states.pop(request.cookies.get(SESSION_COOKIE, ""), None)

    def __len__(self) -> int:
        return len(self._states)


def final_assistant_text(response: object) -> str:
    """Text of the last assistant `message` item of a Responses object's `output` ("" when there is none)."""
    output = response.get("output") if isinstance(response, Mapping) else None
    for item in reversed(output if isinstance(output, list) else []):
        if isinstance(item, Mapping) and item.get("type") == "message" and item.get("role") == "assistant":
            content = item.get("content")
            if isinstance(content, str):
                return content
            parts = content if isinstance(content, list) else []
            return "".join(str(part.get("text", "")) for part in parts if isinstance(part, Mapping))
    return ""


def last_number(text: str) -> float | None:
    """The last number written in `text` (commas inside numbers ignored), or None."""
    numbers = _NUMBER.findall(text.replace(",", ""))
    return float(numbers[-1]) if numbers else None


def forecast(city: str) -> dict[str, Any]:
    """A made-up forecast that depends only on the city's name (case-insensitive)."""
    code = zlib.crc32(city.strip().lower().encode())
    temperature = code % 35 - 5
    condition = WEATHER_CONDITIONS[code // 35 % len(WEATHER_CONDITIONS)]
    description = f"The weather in {city} is {condition} at {temperature} degrees Celsius."
    return {"city": city, "temperature_c": temperature, "weather_description": description}


def _no_session() -> JSONResponse:
    return JSONResponse({"error": f"no session: call /seed_session and send its {SESSION_COOKIE} cookie"}, 400)


def _base_app(title: str) -> FastAPI:
    app = FastAPI(title=title)

    @app.get("/health")
    async def health() -> dict[str, str]:
        return {"status": "ok"}

    return app


def create_math_app() -> FastAPI:
    """Verify: reward 1.0 when the last number of the final answer equals the row's `expected_answer`."""
    app = _base_app("asyncppo math resources server")

    @app.post("/seed_session")
    async def seed_session() -> dict[str, Any]:
        return {}

    @app.post("/verify")
    async def verify(body: dict[str, Any]) -> dict[str, Any]:
        extracted = last_number(final_assistant_text(body.get("response")))
        expected = last_number(str(body.get("expected_answer", "")))
        correct = extracted is not None and extracted == expected
        return {**body, "reward": 1.0 if correct else 0.0, "extracted_answer": extracted}

    return app


def create_weather_app() -> FastAPI:
    """Tool `get_weather(city)`; verify rewards a final answer that names the last returned temperature."""
    app = _base_app("asyncppo weather resources server")
    sessions = Sessions()

    @app.post("/seed_session")
    async def seed_session(response: Response) -> dict[str, Any]:
        sessions.seed(response, {"temperatures": []})
        return {}

    @app.post("/get_weather", response_model=None)
    async def get_weather(request: Request, body: dict[str, Any]) -> dict[str, Any] | JSONResponse:
        state = sessions.get(request)
        if state is None:
            return _no_session()
        city = body.get("city")
        if not isinstance(city, str) or not city.strip():
            return JSONResponse({"error": f"get_weather needs a non-empty string `city`, got {city!r}"}, 400)
        result = forecast(city)
        state["temperatures"].append(result["temperature_c"])
        return result

    @app.post("/verify", response_model=None)
    async def verify(request: Request, body: dict[str, Any]) -> dict[str, Any] | JSONResponse:
        state = sessions.end(request)
        if state is None:
            return _no_session()
        text = final_assistant_text(body.get("response"))
        mentioned = {float(number) for number in _NUMBER.findall(text)}
        correct = bool(state["temperatures"]) and float(state["temperatures"][-1]) in mentioned
        return {**body, "reward": 1.0 if correct else 0.0}

    return app


def create_session_counter_app() -> FastAPI:
    """Tool `increment()` counts per session (from the row's `initial_count`, default 0); verify rewards a final
    count equal to the row's `target_count`."""
    app = _base_app("asyncppo session_counter resources server")
    sessions = Sessions()

    @app.post("/seed_session", response_model=None)
    async def seed_session(response: Response, body: dict[str, Any]) -> dict[str, Any] | JSONResponse:
        initial_count = body.get("initial_count", 0)
        if isinstance(initial_count, bool) or not isinstance(initial_count, int):
            return JSONResponse({"error": f"initial_count must be an integer, got {initial_count!r}"}, 422)
        sessions.seed(response, {"count": initial_count})
        return {}

    @app.post("/increment", response_model=None)
    async def increment(request: Request) -> dict[str, Any] | JSONResponse:
        state = sessions.get(request)
        if state is None:
            return _no_session()
        state["count"] += 1
        return {"count": state["count"]}

    @app.post("/verify", response_model=None)
    async def verify(request: Request, body: dict[str, Any]) -> dict[str, Any] | JSONResponse:
        state = sessions.end(request)
        if state is None:
            return _no_session()
        reward = 1.0 if state["count"] == body.get("target_count") else 0.0
        return {**body, "reward": reward, "final_count": state["count"]}

    return app


def create_multi_step_app() -> FastAPI:
    """Tools `add(a, b)` and `multiply(a, b)` on integers for rows asking for `(a + b) * c` (row field
    `operands: [a, b, c]`); verify rewards a final answer whose last number equals the row's `expected_answer`.

    A tool answers `{"result": n}`, or 400 with an error body naming the argument when `a` or `b` is missing or
    not an integer (other argument keys are ignored). Verify also reports `num_tool_calls` (every add/multiply
    call of the session, bad ones included) and `dependent_calls_ok` (see `dependent_calls_ok`); both are
    diagnostics, the reward is the answer alone (`reward_components: {"correct_answer": reward}`).
    """
    app = _base_app("asyncppo multi_step resources server")
    sessions = Sessions()

    @app.post("/seed_session", response_model=None)
    async def seed_session(response: Response, body: dict[str, Any]) -> dict[str, Any] | JSONResponse:
        operands = body.get("operands")
        if not isinstance(operands, list) or len(operands) != 3 or not all(_is_int(value) for value in operands):
            return JSONResponse(
                {"error": f"operands must be a list of three integers [a, b, c], got {operands!r}"}, 422
            )
        sessions.seed(response, {"operands": list(operands), "calls": []})
        return {}

    def tool(name: str, compute: Callable[[int, int], int]) -> None:
        @app.post(f"/{name}", name=name, response_model=None)
        async def call(request: Request, body: dict[str, Any]) -> dict[str, Any] | JSONResponse:
            state = sessions.get(request)
            if state is None:
                return _no_session()
            record: dict[str, Any] = {"name": name, "arguments": body, "result": None}
            state["calls"].append(record)
            if problem := _integer_arguments_problem(name, body):
                return JSONResponse({"error": problem}, 400)
            record["result"] = compute(body["a"], body["b"])
            return {"result": record["result"]}

    tool("add", lambda a, b: a + b)
    tool("multiply", lambda a, b: a * b)

    @app.post("/verify", response_model=None)
    async def verify(request: Request, body: dict[str, Any]) -> dict[str, Any] | JSONResponse:
        state = sessions.end(request)
        if state is None:
            return _no_session()
        expected = last_number(str(body.get("expected_answer", "")))
        if expected is None:
            return JSONResponse(
                {"error": f"expected_answer must be a number, got {body.get('expected_answer')!r}"}, 422
            )
        extracted = last_number(final_assistant_text(body.get("response")))
        reward = 1.0 if extracted == expected else 0.0
        return {
            **body,
            "reward": reward,
            "reward_components": {"correct_answer": reward},
            "extracted_answer": extracted,
            "num_tool_calls": len(state["calls"]),
            "dependent_calls_ok": dependent_calls_ok(state["calls"], state["operands"]),
        }

    return app


def dependent_calls_ok(calls: list[dict[str, Any]], operands: list[int]) -> bool:
    """Whether a successful `add` of a and b (either order) was followed, later in `calls`, by a successful
    `multiply` of its result and c (either order): the second call depended on the first one's output."""
    a, b, c = operands
    for position, call in enumerate(calls):
        if call["name"] != "add" or call["result"] is None or _int_pair(call) != sorted((a, b)):
            continue
        for later in calls[position + 1 :]:
            if later["name"] == "multiply" and later["result"] is not None and _int_pair(later) == sorted((a + b, c)):
                return True
    return False


def _integer_arguments_problem(tool: str, arguments: dict[str, Any]) -> str | None:
    """What is wrong with a multi_step tool call's `a` and `b` (the first of them missing or not an integer)."""
    for key in ("a", "b"):
        if key not in arguments:
            return f"{tool} needs an integer argument `{key}`, it is missing"
        if not _is_int(arguments[key]):
            return f"{tool} needs an integer `{key}`, got {arguments[key]!r}"
    return None


def _int_pair(call: dict[str, Any]) -> list[int]:
    return sorted((call["arguments"]["a"], call["arguments"]["b"]))


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)  # JSON true is not a number


RESOURCES_APPS: dict[str, Callable[[], FastAPI]] = {
    "math": create_math_app,
    "weather": create_weather_app,
    "session_counter": create_session_counter_app,
    "multi_step": create_multi_step_app,
}


def create_resources_app(name: str, api_key: str | None = None) -> FastAPI:
    """The built-in resources server called `name` (one of RESOURCES_APPS); `api_key` (when set) is required as
    `Authorization: Bearer <key>` on every route but GET /health."""
    if name not in RESOURCES_APPS:
        raise ValueError(f"unknown built-in resources server {name!r}; expected one of {sorted(RESOURCES_APPS)}")
    app = RESOURCES_APPS[name]()
    require_api_key(app, api_key)
    return app
