"""A faulty gym agent for the training-level fault tests: a proxy in front of a real built-in agent.

Each `POST /run` takes the next behaviour of a script (the last one repeats): `ok` forwards the body to the
real agent and returns its answer; `500` answers a server error; `hang` sleeps past the rollout deadline;
`drop` promises a body and closes the connection mid-way; `malformed` answers 200 with a truncated JSON body;
`no_tokens` answers 200 with a result whose output has no generated tokens (the agent died before its first
model call). It runs on a uvicorn thread on 127.0.0.1.
"""

import asyncio
import socket
import threading
import time
from typing import Any

import httpx
import uvicorn
from starlette.types import Receive, Scope, Send

HANG_S = 30.0


class FaultyAgent:
    """The proxy server; `requests` counts every `/run` it received by behaviour."""

    def __init__(self, upstream_url: str, script: list[str]) -> None:
        self.upstream_url = upstream_url.rstrip("/")
        self.script = list(script)
        self.requests: dict[str, int] = {}
        self._lock = threading.Lock()
        self._socket = socket.create_server(("127.0.0.1", 0))
        self.port = self._socket.getsockname()[1]
        config = uvicorn.Config(self._app, interface="asgi3", log_level="critical", timeout_graceful_shutdown=1)
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._server.run, kwargs={"sockets": [self._socket]}, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _next_behaviour(self) -> str:
        with self._lock:
            behaviour = self.script.pop(0) if len(self.script) > 1 else self.script[0]
            self.requests[behaviour] = self.requests.get(behaviour, 0) + 1
            return behaviour

    async def _app(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        if scope["path"] != "/run":
            await _respond(send, 404, b'{"error": "not found"}')
            return
        behaviour = self._next_behaviour()
        if behaviour == "ok":
            async with httpx.AsyncClient(timeout=None) as http:
                answer = await http.post(f"{self.upstream_url}/run", content=body, headers=_json_headers())
            await _respond(send, answer.status_code, answer.content)
        elif behaviour == "500":
            await _respond(send, 500, b'"Hit an exception in the agent"')
        elif behaviour == "hang":
            await asyncio.sleep(HANG_S)
            await _respond(send, 500, b'"too late"')
        elif behaviour == "drop":
            headers = [(b"content-type", b"application/json"), (b"content-length", b"1000")]
            await send({"type": "http.response.start", "status": 200, "headers": headers})
            await send({"type": "http.response.body", "body": b"{", "more_body": True})
            raise ConnectionAbortedError("scripted drop")
        elif behaviour == "malformed":
            await _respond(send, 200, b'{"reward": 1.0, "response": ')
        elif behaviour == "no_tokens":
            await _respond(send, 200, b'{"reward": 0.0, "response": {"output": []}, "responses_create_params": {}}')
        else:
            raise AssertionError(f"unknown behaviour {behaviour!r}")

    def start(self) -> None:
        self._thread.start()
        deadline = time.monotonic() + 10
        while not self._server.started:
            assert time.monotonic() < deadline, "faulty agent did not start"
            time.sleep(0.02)

    def stop(self) -> None:
        self._server.should_exit = True
        self._server.force_exit = True  # a hanging request must not hold the test's teardown
        self._thread.join(timeout=10)
        self._socket.close()


def _json_headers() -> dict[str, str]:
    return {"content-type": "application/json"}


async def _respond(send: Send, status: int, body: bytes) -> None:
    headers: list[Any] = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
