"""Strict JSON request bodies and error answers of the gym HTTP servers: bad input is a 4xx naming the field.

`policy_server.py` parses every POST body with `parse_body`:

    raw bytes --UTF-8--> text --JSON (no NaN/Infinity, finite numbers)--> value --depth, lone surrogates-->
      --pydantic--> request model        any failure: RequestError(400 or 422, "<field>: <problem>, got <value>")

Python's json module accepts what JSON forbids (NaN, Infinity, lone surrogate escapes such as "\\ud800"), and
those values would later break the tokenizer or the JSON encoder of the answer (a 500); they are refused here.
"""

import json
import math
from typing import Any, TypeVar

from fastapi.responses import JSONResponse
from pydantic import BaseModel, ValidationError

from asyncppo.gym.results import quote

Model = TypeVar("Model", bound=BaseModel)

MAX_NESTING_DEPTH = 64
"""Deepest JSON nesting served; deeper bodies (far beyond any real tool schema) would exhaust the recursion of
the validator and the chat template."""


class RequestError(Exception):
    """A request the server refuses; answered as an OpenAI error body with `status` (and `param`, the field)."""

    def __init__(self, status: int, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param


def error_response(status: int, message: str, param: str | None = None) -> JSONResponse:
    """The OpenAI error body `{"error": {message, type, param, code}}`."""
    error_type = "invalid_request_error" if status < 500 else "server_error"
    error = {"message": message, "type": error_type, "param": param, "code": status}
    return JSONResponse({"error": error}, status_code=status)


def parse_body(model: type[Model], raw: bytes) -> Model:
    """The request `model` of a raw body; RequestError(400) for a body that is not strict JSON, 422 for one that
    does not fit the model (the first problem, with its field path, the value and what was expected)."""
    try:
        return model.model_validate(parse_json(raw))
    except ValidationError as error:
        problems = error.errors(include_url=False)
        # A union field reports one problem per member; the deepest path is the most specific one.
        first = max(problems, key=lambda problem: len(problem["loc"]))
        path = field_path(first["loc"])
        more = f" (and {len(problems) - 1} more problems)" if len(problems) > 1 else ""
        value = first.get("input")
        shown = quote(json.dumps(value, ensure_ascii=False) if isinstance(value, str) else value)
        message = f"{path or 'body'}: {first['msg']}, got {shown}{more}"
        raise RequestError(422, message, path or None) from None


def parse_json(raw: bytes) -> Any:
    """The JSON value of `raw`; RequestError(400) naming what is wrong and where."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as error:
        problem = f"not UTF-8 ({error.reason} at byte {error.start})"
        raise RequestError(400, f"body: {problem}; expected a JSON object") from None
    try:
        value = json.loads(text, parse_constant=_reject_constant, parse_float=_finite_float)
    except json.JSONDecodeError as error:
        where = f"line {error.lineno} column {error.colno}"
        raise RequestError(400, f"body: not valid JSON ({error.msg} at {where}); expected a JSON object") from None
    except ValueError as error:  # NaN/Infinity, a float overflowing to inf, an integer over Python's digit limit
        raise RequestError(400, f"body: {error}") from None
    except RecursionError:
        raise RequestError(400, f"body: nested deeper than {MAX_NESTING_DEPTH} levels") from None
    _check_value(value)
    return value


def field_path(location: tuple[int | str, ...]) -> str:
    """`messages[0].content` for pydantic's ('messages', 0, 'content'); union member names
    ('str', 'list[...]', 'function-after[...]') are dropped."""
    path = ""
    for part in location:
        if isinstance(part, int):
            path += f"[{part}]"
        elif "[" not in part and part not in _TYPE_NAMES:
            path += f".{part}" if path else part
    return path


_TYPE_NAMES = frozenset({"str", "int", "float", "bool", "none", "list", "dict", "tuple", "literal", "nullable"})


def _reject_constant(name: str) -> float:
    raise ValueError(f"{name} is not a JSON number; expected a finite number")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"{quote(text)} overflows a 64-bit float; expected a finite number")
    return value


def _check_value(value: Any) -> None:
    """RequestError(400) for nesting deeper than MAX_NESTING_DEPTH or a string holding a lone surrogate (which
    no UTF-8 text can carry); iterative, so a deep body cannot exhaust the recursion here."""
    pending: list[tuple[Any, str, int]] = [(value, "", 0)]
    while pending:
        item, path, depth = pending.pop()
        if depth > MAX_NESTING_DEPTH:
            raise RequestError(400, f"{path or 'body'}: nested deeper than {MAX_NESTING_DEPTH} levels", path or None)
        if isinstance(item, str):
            _check_text(item, path)
        elif isinstance(item, dict):
            for key, child in item.items():
                _check_text(key, f"{path}.{key}" if path else str(key))
                pending.append((child, f"{path}.{key}" if path else key, depth + 1))
        elif isinstance(item, list):
            pending.extend((child, f"{path}[{index}]", depth + 1) for index, child in enumerate(item))


def _check_text(text: str, path: str) -> None:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as error:
        code_point = f"U+{ord(text[error.start]):04X}"
        where = _escaped(path) or "body"
        raise RequestError(
            400,
            f"{where}: a lone surrogate {code_point} at character {error.start}, got "
            f"{quote(json.dumps(text))}; expected valid Unicode text (a surrogate escape must be half of a pair)",
            _escaped(path) or None,
        ) from None


def _escaped(text: str) -> str:
    """`text` with lone surrogates written as backslash escapes, so an error message can quote it."""
    return text.encode("utf-8", "backslashreplace").decode("utf-8")
