"""Limits every gym HTTP server runs under: a request-body cap, a per-request deadline, quiet hang-ups and stops.

`PolicyServer` (the uvicorn runner of the policy server and of every built-in gym server) wraps each app in
`BoundedApp`, so the limits hold on every route, before FastAPI or an auth check sees the request:

    request --Content-Length > max_request_bytes?--> 413, connection closed, body never read
            --read the body under the deadline, counting--> over the cap (chunked): 413 | client gone: one log line
            --the app, body replayed in one message, under the same deadline--> answer
                                                         deadline passed: 408 (body) / 504 (handler), one log line
                                                         server stopping past its grace: 503, no traceback
"""

import asyncio
import logging
from dataclasses import dataclass
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from asyncppo.config.runtime import GymConfig
from asyncppo.gym.request_body import error_response

# uvicorn's own logger: the one line per event lands where uvicorn's warnings go, in its format.
log = logging.getLogger("uvicorn.error")


@dataclass(frozen=True)
class ServerLimits:
    """What one server accepts (plain values from `env.gym`)."""

    max_request_bytes: int
    """Largest request body; a larger one is answered 413 without being read."""
    request_deadline_s: float
    """Longest a request may take, body included; past it the request is answered 408 or 504."""

    def __post_init__(self) -> None:
        if self.max_request_bytes < 1 or not self.request_deadline_s > 0:
            raise ValueError(
                f"ServerLimits: need max_request_bytes >= 1 (got {self.max_request_bytes}) and "
                f"request_deadline_s > 0 (got {self.request_deadline_s})"
            )


def server_limits(gym: GymConfig) -> ServerLimits:
    """The limits of `env.gym`: no request outlives the rollout that makes it (`rollout_deadline_s`)."""
    return ServerLimits(max_request_bytes=gym.max_request_bytes, request_deadline_s=gym.rollout_deadline_s)


DEFAULT_LIMITS = server_limits(GymConfig())
"""The schema's defaults, for servers started outside a run (tests, demos)."""


class BodyTooLargeError(Exception):
    """A streamed body grew past the cap."""


class ClientGoneError(Exception):
    """The client hung up before its body was complete."""

    def __init__(self, received: int) -> None:
        super().__init__(f"hung up after {received} body bytes")
        self.received = received


class BoundedApp:
    """ASGI middleware applying `limits` to every HTTP request of `app` (see the module docstring)."""

    def __init__(self, app: ASGIApp, limits: ServerLimits) -> None:
        self.app = app
        self.limits = limits

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":  # lifespan events pass through
            await self.app(scope, receive, send)
            return
        cap = self.limits.max_request_bytes
        declared = _content_length(scope)
        if declared is not None and declared > cap:
            await _send_error(send, 413, f"request body of {declared} bytes is over the limit of {cap} bytes")
            return
        response = _ResponseState(send)
        reading = True
        try:
            async with asyncio.timeout(self.limits.request_deadline_s):
                body = await _read_body(receive, cap)
                reading = False
                await self.app(scope, _replay(body, receive), response.send)
        except BodyTooLargeError:
            await _send_error(send, 413, f"request body is over the limit of {cap} bytes")
        except ClientGoneError as gone:
            expected = f" of {declared}" if declared is not None else ""
            log.warning(
                "%s hung up after %d%s body bytes; request dropped", _request_name(scope), gone.received, expected
            )
        except TimeoutError:
            status, what = (408, "the request body did not arrive") if reading else (504, "no answer")
            message = f"{what} within the request deadline of {self.limits.request_deadline_s} s"
            log.warning("%s: %s; answered %d", _request_name(scope), message, status)
            if not response.started:
                await _send_error(send, status, message)
        except asyncio.CancelledError:
            # uvicorn cancels requests still running once a stop's grace period is over, and logs a traceback for
            # any that ends cancelled. The request is over either way: answer it and end the task normally.
            if not response.started:
                await _send_error(send, 503, "the server is shutting down")


class _ResponseState:
    """Passes messages to `send` and remembers whether the response has started."""

    def __init__(self, send: Send) -> None:
        self._send = send
        self.started = False

    async def send(self, message: Message) -> None:
        self.started = True
        await self._send(message)


async def _read_body(receive: Receive, cap: int) -> bytes:
    """The whole body, read chunk by chunk; BodyTooLargeError as soon as it passes `cap` bytes, ClientGoneError
    when the client hangs up first."""
    chunks: list[bytes] = []
    received = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise ClientGoneError(received)
        chunk: bytes = message.get("body", b"")
        received += len(chunk)
        if received > cap:
            raise BodyTooLargeError
        chunks.append(chunk)
        if not message.get("more_body", False):
            return b"".join(chunks)


def _replay(body: bytes, receive: Receive) -> Receive:
    """A receive that gives the app the whole body in one message, then the connection's own events."""
    pending = [{"type": "http.request", "body": body, "more_body": False}]

    async def replayed() -> Message:
        return pending.pop() if pending else await receive()

    return replayed


def _content_length(scope: Scope) -> int | None:
    headers: list[tuple[bytes, bytes]] = scope["headers"]
    for name, value in headers:
        if name == b"content-length":
            return int(value) if value.isdigit() else None  # the HTTP parser has refused malformed values already
    return None


def _request_name(scope: Scope) -> str:
    client: Any = scope.get("client")
    who = f"{client[0]}:{client[1]}" if client else "a client"
    return f"{scope['method']} {scope['path']} from {who}"


async def _send_error(send: Send, status: int, message: str) -> None:
    """An error body as the servers' others (`request_body.error_response`), closing the connection: the client
    may still be sending a body nobody will read."""
    response = error_response(status, message)
    headers = [*response.raw_headers, (b"connection", b"close")]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": response.body, "more_body": False})
