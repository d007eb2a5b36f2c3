"""PolicyServer: runs an ASGI app (the policy app of `policy_server.py`, or a built-in gym server's) with uvicorn on
a background thread, on a loopback port reserved at construction, behind the request limits of `request_limits.py`.

    PolicyServer(app, port, limits) --start()--> serving once GET /health answers --stop()--> running requests get
    STOP_GRACE_S, then 503; the thread joined
"""

import socket
import threading
import time

import httpx
import uvicorn
from fastapi import FastAPI

from asyncppo.gym.request_limits import DEFAULT_LIMITS, BoundedApp, ServerLimits

STOP_GRACE_S = 5
"""How long a stopping server lets running requests finish before it answers them 503 and exits."""


def listening_socket(host: str, port: int) -> socket.socket:
    """A TCP socket listening on (host, port), made with proto=IPPROTO_TCP: asyncio sets TCP_NODELAY only on the
    connections of such a socket (`socket.create_server` makes proto 0), and without it each answer that uvicorn
    writes in two parts (head, then body) waits about 40 ms for the client's delayed ACK (Nagle's algorithm)."""
    listener = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    try:
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as socket.create_server does on POSIX
        listener.bind((host, port))
        listener.listen()
    except OSError:
        listener.close()
        raise
    return listener


class PolicyServer:
    """Runs an app with uvicorn on a background thread, on a port reserved at construction, under `limits`.

    The runner of the policy server and of every built-in gym server. The listening socket is bound in __init__,
    so `url` can be handed to Gym before the model is loaded and start() is called (clients then wait on a port
    that exists). Every request passes `request_limits.BoundedApp` (body cap, deadline, quiet hang-ups).
    start() returns once GET /health answers; stop() shuts uvicorn down (running requests get `stop_grace_s`,
    then a 503), joins the thread and closes the socket, freeing the port.
    """

    def __init__(
        self,
        app: FastAPI,
        host: str = "127.0.0.1",
        port: int = 0,
        limits: ServerLimits = DEFAULT_LIMITS,
        stop_grace_s: int = STOP_GRACE_S,
    ) -> None:
        self._socket = listening_socket(host, port)
        self._host, self._port = host, self._socket.getsockname()[1]
        config = uvicorn.Config(
            BoundedApp(app, limits), log_level="warning", access_log=False, timeout_graceful_shutdown=stop_grace_s
        )
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(
            target=self._server.run, kwargs={"sockets": [self._socket]}, name=f"policy-server-{self._port}", daemon=True
        )

    @property
    def url(self) -> str:
        """Base URL of the OpenAI routes, e.g. http://127.0.0.1:PORT/v1 (root routes drop the /v1)."""
        return f"http://{self._host}:{self._port}/v1"

    @property
    def port(self) -> int:
        return self._port

    @property
    def requests_received(self) -> int:
        """HTTP requests received since start (uvicorn's own count, GET /health included): the trainer reads it to
        tell a gym whose model server never calls this server from one that is only slow."""
        return self._server.server_state.total_requests

    def start(self, timeout_s: float = 30.0) -> None:
        """Start serving and wait until /health answers; RuntimeError if it does not within `timeout_s`."""
        self._thread.start()
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if not self._thread.is_alive():
                raise RuntimeError(f"the policy server thread exited while starting on port {self._port}")
            try:
                if httpx.get(f"http://{self._host}:{self._port}/health", timeout=1.0).status_code == 200:
                    return
            except httpx.TransportError:  # not accepting yet; polling until the deadline is the point
                pass
            time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"the policy server on port {self._port} did not answer /health within {timeout_s} s")

    def stop(self, timeout_s: float = 30.0) -> None:
        """Stop accepting, let in-flight requests finish, join the thread and release the port."""
        self._server.should_exit = True
        if self._thread.is_alive():
            self._thread.join(timeout_s)
            if self._thread.is_alive():
                raise RuntimeError(f"the policy server on port {self._port} did not stop within {timeout_s} s")
        self._socket.close()

    def __enter__(self) -> "PolicyServer":
        self.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.stop()
