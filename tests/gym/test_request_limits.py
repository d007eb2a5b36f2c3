"""Bounded servers over real HTTP on 127.0.0.1: the body cap (413 before the body is read), body work off the event
loop, per-request deadlines, one log line for a client hanging up mid-body, a stop while requests run, and the
warning line of a server started without an API key."""

import functools
import json
import socket
import threading
from collections.abc import Iterator
from concurrent.futures import Future
from typing import Any

import httpx
import pytest
from gym_fakes import ScriptedGenerator, policy_server_of
from pydantic import ValidationError
from transformers import PreTrainedTokenizerBase

from asyncppo.config.runtime import GymConfig
from asyncppo.generation.protocol import GenerationRequest, GenerationResult
from asyncppo.gym.policy_server_runner import PolicyServer
from asyncppo.gym.request_limits import DEFAULT_LIMITS, ServerLimits, server_limits
from asyncppo.gym.servers.launch import launch_builtin_gym
from asyncppo.models.tiny import EOS_TOKEN_ID

CHAT = "/v1/chat/completions"
BODY = {"model": "policy", "messages": [{"role": "user", "content": "hi"}], "temperature": 1.0, "top_p": 1.0}


class StuckGenerator:
    """Accepts every request and never answers it; `submitted` is set once one arrived."""

    def __init__(self) -> None:
        self.submitted = threading.Event()

    def submit(self, request: GenerationRequest) -> "Future[GenerationResult]":
        self.submitted.set()
        return Future()


def root(server: PolicyServer) -> str:
    return server.url.removesuffix("/v1")


def exchange(server: PolicyServer, request: bytes, timeout_s: float = 10.0) -> tuple[int, dict[str, Any]]:
    """Send raw `request` bytes and read until the server closes the connection: (status, JSON body). A server that
    waits for more of the body instead of answering makes this time out."""
    with socket.create_connection(("127.0.0.1", server.port), timeout=timeout_s) as connection:
        connection.sendall(request)
        answer = b""
        while chunk := connection.recv(65536):
            answer += chunk
    head, _, body = answer.partition(b"\r\n\r\n")
    return int(head.split()[1]), json.loads(body)


def post_head(path: str, *headers: str) -> bytes:
    lines = [f"POST {path} HTTP/1.1", "host: 127.0.0.1", "content-type: application/json", *headers]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


@pytest.fixture
def scripted(tokenizer: PreTrainedTokenizerBase) -> Iterator[PolicyServer]:
    with policy_server_of(ScriptedGenerator([EOS_TOKEN_ID]), tokenizer) as server:
        yield server


def test_a_body_declared_over_the_limit_is_answered_413_before_it_is_sent(scripted: PolicyServer) -> None:
    # Headers claim 64 MiB, five bytes follow: only an answer that does not wait for the body can arrive.
    status, body = exchange(scripted, post_head(CHAT, f"content-length: {64 << 20}") + b'{"mod')
    assert status == 413
    assert body["error"] == {
        "message": f"request body of {64 << 20} bytes is over the limit of {8 << 20} bytes",
        "type": "invalid_request_error",
        "param": None,
        "code": 413,
    }
    assert httpx.get(f"{root(scripted)}/health").status_code == 200


def test_a_chunked_body_is_cut_off_at_the_limit(tokenizer: PreTrainedTokenizerBase) -> None:
    limits = ServerLimits(max_request_bytes=1000, request_deadline_s=30)
    with policy_server_of(ScriptedGenerator([EOS_TOKEN_ID]), tokenizer, limits=limits) as server:
        # 3 chunks of 400 bytes pass the 1000-byte cap in the third; the terminating chunk never comes.
        chunks = b"".join(b"190\r\n" + b" " * 400 + b"\r\n" for _ in range(3))
        status, body = exchange(server, post_head(CHAT, "transfer-encoding: chunked") + chunks)
    assert status == 413
    assert body["error"]["message"] == "request body is over the limit of 1000 bytes"


def test_a_body_exactly_at_the_limit_is_served_and_one_byte_more_is_not(tokenizer: PreTrainedTokenizerBase) -> None:
    content = json.dumps(BODY | {"max_tokens": 1}).encode()
    limits = ServerLimits(max_request_bytes=len(content), request_deadline_s=30)
    with policy_server_of(ScriptedGenerator([EOS_TOKEN_ID]), tokenizer, limits=limits) as server:
        headers = {"content-type": "application/json"}
        assert httpx.post(f"{root(server)}{CHAT}", content=content, headers=headers).status_code == 200
        assert httpx.post(f"{root(server)}{CHAT}", content=content + b" ", headers=headers).status_code == 413


def test_every_builtin_gym_server_has_the_body_limit() -> None:
    limits = ServerLimits(max_request_bytes=100, request_deadline_s=30)
    with launch_builtin_gym("http://127.0.0.1:1/v1", max_steps=1, limits=limits) as gym:
        servers = [gym._head, *gym._agents.values(), *gym._resources.values()]
        for server, path in zip(servers, ["/", "/run", "/verify"], strict=True):
            status, _ = exchange(server, post_head(path, "content-length: 101"))
            assert status == 413, path


def test_health_answers_while_a_request_is_being_templated(
    tokenizer: PreTrainedTokenizerBase, monkeypatch: pytest.MonkeyPatch
) -> None:
    entered, release = threading.Event(), threading.Event()
    render = tokenizer.apply_chat_template

    @functools.wraps(render)
    def blocking_render(*args: Any, **kwargs: Any) -> Any:
        entered.set()
        release.wait(30)  # the test releases it; 30 s only bounds a failing run
        return render(*args, **kwargs)

    monkeypatch.setattr(tokenizer, "apply_chat_template", blocking_render)
    with policy_server_of(ScriptedGenerator([EOS_TOKEN_ID]), tokenizer) as server:
        answers: list[httpx.Response] = []
        client = threading.Thread(target=lambda: answers.append(httpx.post(f"{root(server)}{CHAT}", json=BODY)))
        client.start()
        try:
            assert entered.wait(10), "the request never reached the chat template"
            # The template is blocked mid-render: a server rendering on its event loop could not answer this.
            assert httpx.get(f"{root(server)}/health", timeout=10).json() == {"status": "ok"}
        finally:
            release.set()
            client.join(30)
    assert answers[0].status_code == 200


def test_a_client_hanging_up_mid_body_is_one_log_line_without_a_traceback(
    tokenizer: PreTrainedTokenizerBase, capfd: pytest.CaptureFixture[str]
) -> None:
    with policy_server_of(ScriptedGenerator([EOS_TOKEN_ID]), tokenizer) as server:
        for _ in range(3):
            with socket.create_connection(("127.0.0.1", server.port)) as connection:
                connection.sendall(post_head(CHAT, "content-length: 1000") + b'{"model": "policy"')
        assert httpx.post(f"{root(server)}{CHAT}", json=BODY).status_code == 200  # after the hang-ups: served
    # stop() has joined the server thread, so every line it logs is written.
    lines = capfd.readouterr().err.splitlines()
    hang_ups = [line for line in lines if "hung up" in line]
    assert len(hang_ups) == 3, lines
    assert "POST /v1/chat/completions from 127.0.0.1:" in hang_ups[0]
    assert hang_ups[0].endswith("hung up after 18 of 1000 body bytes; request dropped")
    assert not [line for line in lines if "Traceback" in line or "Exception" in line], lines


def test_a_request_past_its_deadline_is_answered_504_and_a_stalled_body_408(
    tokenizer: PreTrainedTokenizerBase,
) -> None:
    limits = ServerLimits(max_request_bytes=DEFAULT_LIMITS.max_request_bytes, request_deadline_s=0.5)
    with policy_server_of(StuckGenerator(), tokenizer, limits=limits) as server:
        answer = httpx.post(f"{root(server)}{CHAT}", json=BODY, timeout=10)
        assert answer.status_code == 504
        assert answer.json()["error"]["message"] == "no answer within the request deadline of 0.5 s"
        status, body = exchange(server, post_head(CHAT, "content-length: 100") + b"{")
        assert status == 408
        assert body["error"]["message"] == "the request body did not arrive within the request deadline of 0.5 s"


def test_stop_while_a_request_runs_answers_it_503_without_a_traceback(
    tokenizer: PreTrainedTokenizerBase, capfd: pytest.CaptureFixture[str]
) -> None:
    generator = StuckGenerator()
    server = policy_server_of(generator, tokenizer, stop_grace_s=1)
    server.start()
    answers: list[httpx.Response] = []
    client = threading.Thread(target=lambda: answers.append(httpx.post(f"{root(server)}{CHAT}", json=BODY, timeout=30)))
    client.start()
    assert generator.submitted.wait(10)
    server.stop(timeout_s=10)  # raises if the running request kept the server up
    client.join(10)
    assert answers[0].status_code == 503
    assert answers[0].json()["error"]["message"] == "the server is shutting down"
    assert "Traceback" not in capfd.readouterr().err


def test_servers_without_an_api_key_print_one_warning_line_per_start(
    tokenizer: PreTrainedTokenizerBase, capfd: pytest.CaptureFixture[str]
) -> None:
    with (
        policy_server_of(ScriptedGenerator([EOS_TOKEN_ID]), tokenizer) as server,
        launch_builtin_gym(server.url, resources=("math", "weather"), max_steps=1) as gym,
    ):
        for _ in range(3):
            assert httpx.post(f"{root(server)}{CHAT}", json=BODY).status_code == 200
            assert httpx.get(f"{gym.head_url}/global_config_dict_yaml").status_code == 200
    with policy_server_of(ScriptedGenerator([EOS_TOKEN_ID]), tokenizer, api_key="k"):
        pass
    warnings = [line for line in capfd.readouterr().err.splitlines() if line.startswith("warning:")]
    advice = "running unauthenticated (no env.gym.api_key), so any local process can call every route; set "
    advice += "env.gym.api_key to require Authorization: Bearer <key> (docs/security.md)"
    assert warnings == [
        f"warning: the policy server of model 'policy': {advice}",
        f"warning: the built-in gym servers (head {gym.head_url}, agents and resources: math, weather): {advice}",
    ]


def test_limits_come_from_env_gym_and_refuse_nonsense() -> None:
    limits = server_limits(GymConfig(max_request_bytes=1234, rollout_deadline_s=7.5))
    assert limits == ServerLimits(max_request_bytes=1234, request_deadline_s=7.5)
    assert ServerLimits(max_request_bytes=8 * 1024 * 1024, request_deadline_s=600.0) == DEFAULT_LIMITS
    with pytest.raises(ValidationError, match="max_request_bytes"):
        GymConfig(max_request_bytes=0)
    with pytest.raises(ValueError, match=r"max_request_bytes >= 1 \(got 0\)"):
        ServerLimits(max_request_bytes=0, request_deadline_s=1)
