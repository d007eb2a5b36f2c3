"""Fakes of the gym tests: a scripted Generator that returns given token ids and records what it was asked, a
PolicyServer in front of any such generator, a fake agent (any ASGI app) served on a background thread, and a
GymClient of a gym's head server."""

import socket
import threading
import time
from collections.abc import Iterable, Iterator, Sequence
from concurrent.futures import Future
from contextlib import contextmanager
from typing import Any

import torch
import uvicorn
from starlette.types import ASGIApp
from transformers import PreTrainedTokenizerBase

from asyncppo.generation.protocol import FinishReason, GenerationRequest, GenerationResult
from asyncppo.gym.client import GymClient
from asyncppo.gym.policy_server import create_policy_app
from asyncppo.gym.policy_server_runner import STOP_GRACE_S, PolicyServer
from asyncppo.gym.request_limits import DEFAULT_LIMITS, ServerLimits
from asyncppo.types import SamplingProfile

TRAIN_SAMPLING, VALIDATION_SAMPLING = SamplingProfile(1.0, 1.0), SamplingProfile(0.0, 1.0)


class ScriptedGenerator:
    """Answers every request with `token_ids` (cut to max_new_tokens) and logprob -0.5 per token."""

    def __init__(self, token_ids: Sequence[int], finish_reason: FinishReason = "stop") -> None:
        self.token_ids = tuple(token_ids)
        self.finish_reason: FinishReason = finish_reason
        self.requests: list[GenerationRequest] = []

    @property
    def policy_version(self) -> int:
        return 0

    def submit(self, request: GenerationRequest) -> "Future[GenerationResult]":
        self.requests.append(request)
        future: Future[GenerationResult] = Future()
        tokens = self.token_ids[: request.sampling.max_new_tokens]
        future.set_result(GenerationResult(tokens, (-0.5,) * len(tokens), self.finish_reason, 0, 0))
        return future

    def generate(self, requests: Sequence[GenerationRequest]) -> list[GenerationResult]:
        return [self.submit(request).result() for request in requests]

    def pause(self) -> None: ...

    def resume(self) -> None: ...

    def load_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]], version: int) -> None: ...

    def set_policy_version(self, version: int) -> None: ...

    def close(self) -> None: ...


def policy_server_of(
    generator: Any,
    tokenizer: PreTrainedTokenizerBase,
    max_model_len: int = 512,
    api_key: str | None = None,
    train_sampling: SamplingProfile = TRAIN_SAMPLING,
    validation_sampling: SamplingProfile = VALIDATION_SAMPLING,
    limits: ServerLimits = DEFAULT_LIMITS,
    stop_grace_s: int = STOP_GRACE_S,
) -> PolicyServer:
    """A PolicyServer (not started; `with` starts it) of model "policy" that generates with `generator`, any object
    with the Generator methods the server calls (a fake need not implement the rest)."""
    app = create_policy_app(
        generator,
        tokenizer,
        model_name="policy",
        train_sampling=train_sampling,
        validation_sampling=validation_sampling,
        max_model_len=max_model_len,
        api_key=api_key,
    )
    return PolicyServer(app, limits=limits, stop_grace_s=stop_grace_s)


@contextmanager
def serving(app: ASGIApp, listener: socket.socket, name: str) -> Iterator[None]:
    """Serve `app` with uvicorn on `listener` (bound by the caller, who may need the port first) from a background
    thread, for the block; the socket is closed afterwards."""
    server = uvicorn.Server(uvicorn.Config(app, interface="asgi3", log_level="critical", timeout_graceful_shutdown=1))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [listener]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        assert time.monotonic() < deadline, f"{name} did not start"
        time.sleep(0.02)
    try:
        yield
    finally:
        server.should_exit = True
        thread.join(timeout=5)
        listener.close()


def head_client(head_url: str, max_concurrency: int = 1, api_key: str | None = None) -> GymClient:
    """A GymClient that finds the agents through the head server: no retries, 64 output tokens at most."""
    return GymClient(
        None,
        head_url,
        max_concurrency=max_concurrency,
        rollout_deadline_s=30,
        max_retries=0,
        backoff_s=0,
        train_sampling=TRAIN_SAMPLING,
        validation_sampling=VALIDATION_SAMPLING,
        max_output_tokens=64,
        api_key=api_key,
    )
