"""Reads the innermost error out of an agent's error body; `gym/client.py` quotes it and decides on retries.

NeMo-Gym servers answer an unhandled failure of a call they made with a 500 whose JSON body is a string,
`Hit an exception in <Server> calling an inner server: <inner body>`, where `<inner body>` is the Python bytes
literal (`b'...'`) of the inner server's raw body. A policy-server error reaches the trainer wrapped once per hop:

    policy server 404 {"error": {"message": "The model `x` does not exist.", "code": 404}}
      -> model server 500 "Hit an exception in VLLMModel___policy_model calling an inner server: b'{...}'"
      -> agent /v1/responses 500 "Hit an exception in SimpleAgent___a calling an inner server: b'\"Hit ...\"'"
      -> agent /run 500 "Hit an exception in SimpleAgent___a calling an inner server: b'\"Hit ...\"'"

`unwrap_error_body` peels the hops off and returns the innermost message and, when the innermost body is an
OpenAI-style error with a 4xx code, that status (docs/gym-protocol.md, Retries, deadlines and failure counting).
"""

import ast
import json
import re
from dataclasses import dataclass

from asyncppo.gym.results import quote

# The prefix NeMo-Gym's exception middleware puts before the inner server's body.
_WRAPPER = re.compile(r"Hit an exception in (\S+) calling an inner server: ", re.DOTALL)
# Bound on the hops peeled: a real chain is three deep (each hop's escaping makes a body about 4x longer, so the
# body's size bounds the depth anyway); a body nested deeper is quoted as it stands there.
MAX_HOPS = 8
# How much of the innermost message an error quotes (a context-length message is about 150 characters).
MESSAGE_CHARS = 600


@dataclass(frozen=True)
class ErrorBody:
    """What an error body says: the innermost `message`, the servers that wrapped it (outermost first) and the
    innermost status when the innermost body is an OpenAI-style error with a 4xx `code`."""

    message: str
    hops: tuple[str, ...]
    inner_client_status: int | None


def unwrap_error_body(text: str) -> ErrorBody:
    """The innermost error of an agent's error body (any text; never raises)."""
    hops: list[str] = []
    current = text
    while len(hops) < MAX_HOPS:
        parsed = _json_or_text(current)
        if not isinstance(parsed, str):
            message, status = _error_fields(parsed)
            return ErrorBody(message, tuple(hops), status)
        wrapper = _WRAPPER.match(parsed)
        if wrapper is None:
            return ErrorBody(quote(parsed, MESSAGE_CHARS), tuple(hops), None)
        hops.append(wrapper.group(1))
        current = _bytes_literal_text(parsed[wrapper.end() :])
    return ErrorBody(quote(current, MESSAGE_CHARS), tuple(hops), None)


def _json_or_text(text: str) -> object:
    try:
        return json.loads(text)
    except (json.JSONDecodeError, RecursionError):
        return text


def _bytes_literal_text(text: str) -> str:
    """The decoded bytes of a Python bytes literal (what NeMo-Gym prints for the inner body), else `text`."""
    if not text.startswith(("b'", 'b"')):
        return text
    try:
        value = ast.literal_eval(text)  # a literal only: nothing in the body is executed
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        return text
    return value.decode("utf-8", errors="replace") if isinstance(value, bytes) else text


def _error_fields(body: object) -> tuple[str, int | None]:
    """(message, 4xx code or None) of an error body: OpenAI's `{"error": {"message", "code"}}`, vLLM's
    `{"object": "error", "message", "code"}`, `{"error": str}` or FastAPI's `{"detail": ...}`; else the body quoted."""
    if not isinstance(body, dict):
        return quote(body, MESSAGE_CHARS), None
    error = body.get("error")
    source = error if isinstance(error, dict) else body
    message = source.get("message")
    if isinstance(message, str):
        code = source.get("code")
        is_client_status = isinstance(code, int) and not isinstance(code, bool) and 400 <= code < 500
        return quote(message, MESSAGE_CHARS), code if is_client_status else None
    if isinstance(error, str):
        return quote(error, MESSAGE_CHARS), None
    if "detail" in body:
        return quote(body["detail"], MESSAGE_CHARS), None
    return quote(body, MESSAGE_CHARS), None
