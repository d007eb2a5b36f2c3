"""A scripted Generator for the policy server tests: returns given token ids and records what it was asked."""

from collections.abc import Iterable, Sequence
from concurrent.futures import Future

import torch

from asyncppo.generation.protocol import FinishReason, GenerationRequest, GenerationResult


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
