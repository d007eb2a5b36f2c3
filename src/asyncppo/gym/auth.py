"""The bearer-key check every gym HTTP server runs: policy server, simple agent, head and resources servers.

One key (`env.gym.api_key`) guards them all: an agent forwards the key to the policy server, so an agent that
answered without it would hand out completions to any local process. Servers started without it say so once,
with `warn_if_unauthenticated`.
"""

import secrets
import sys
from collections.abc import Awaitable, Callable

from fastapi import FastAPI, Request, Response

from asyncppo.gym.request_body import error_response

OPEN_PATHS = frozenset({"/health"})
"""Routes served without the key: readiness probes carry none."""


def bearer_headers(api_key: str | None) -> dict[str, str]:
    """The `Authorization` header that carries `api_key` (none without a key)."""
    return {"Authorization": f"Bearer {api_key}"} if api_key is not None else {}


def require_api_key(app: FastAPI, api_key: str | None) -> None:
    """When `api_key` is set, answer 401 to every request outside OPEN_PATHS without `Authorization: Bearer <key>`."""
    if api_key is None:
        return
    expected = f"Bearer {api_key}".encode()

    @app.middleware("http")
    async def _check_api_key(request: Request, call_next: Callable[[Request], Awaitable[Response]]) -> Response:
        if request.url.path not in OPEN_PATHS:
            given = request.headers.get("authorization", "").encode()
            if not secrets.compare_digest(given, expected):
                return error_response(401, "missing or wrong API key (send Authorization: Bearer <key>)")
        return await call_next(request)


def warn_if_unauthenticated(api_key: str | None, servers: str) -> None:
    """Without `api_key`: one `warning:` line on stderr saying that `servers` answer anyone, and how to require a key.

    Called once per server start (the policy server's startup, the built-in gym's launch), never per request.
    """
    if api_key is None:
        print(
            f"warning: {servers}: running unauthenticated (no env.gym.api_key), so any local process can call "
            "every route; set env.gym.api_key to require Authorization: Bearer <key> (docs/security.md)",
            file=sys.stderr,
            flush=True,
        )
