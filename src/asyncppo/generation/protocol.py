"""The Generator protocol: token ids and sampling settings in, generated ids with per-token logprobs out.

Every engine (`hf`, `graph`, `replay`: a ServingFront over its backend's core, see `serving_front.py`) implements
it; the rollout code, the policy HTTP server and the workers only ever talk to this protocol. Requests are batched
by the engine itself, so concurrent callers (collector threads, HTTP handlers) share one engine.
"""

from collections.abc import Iterable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Literal, Protocol

import torch

from asyncppo.types import SamplingProfile

FinishReason = Literal["stop", "length"]


class GeneratorClosedError(RuntimeError):
    """The engine was closed before (or while) the request could run."""


@dataclass(frozen=True)
class SamplingParams:
    """How to sample one request. top_k = 0 and top_p = 1.0 switch those filters off."""

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    max_new_tokens: int = 256
    stop_token_ids: tuple[int, ...] = ()
    """Token ids that end the generation (the engine's EOS ids always do); the stop token is kept."""
    greedy: bool = False
    """Take the argmax instead of sampling (validation at temperature 0); logprobs use temperature 1."""
    ignore_eos: bool = False
    """Generate exactly max_new_tokens (or up to the context limit): neither EOS nor stop ids end the request.
    For benchmarks of fixed lengths."""
    seed: int | None = None
    """The request's own sampling seed (graph engine): its tokens then do not depend on which other requests
    share its batches. None = the engine derives one from its seed and the request's submission order."""

    def __post_init__(self) -> None:
        if self.temperature <= 0:
            raise ValueError(f"temperature={self.temperature} must be > 0 (use greedy=True for argmax decoding)")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p={self.top_p} must be in (0, 1]")
        if self.top_k < 0:
            raise ValueError(f"top_k={self.top_k} must be >= 0 (0 disables it)")
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens={self.max_new_tokens} must be >= 1")

    @classmethod
    def for_profile(
        cls,
        profile: SamplingProfile,
        max_new_tokens: int,
        *,
        top_k: int = 0,
        stop_token_ids: tuple[int, ...] = (),
        ignore_eos: bool = False,
    ) -> "SamplingParams":
        """The params that sample as `profile` does; its temperature 0 decodes greedily (logprobs at temperature 1)."""
        greedy = profile.temperature == 0
        return cls(
            temperature=1.0 if greedy else profile.temperature,
            top_p=profile.top_p,
            top_k=top_k,
            max_new_tokens=max_new_tokens,
            stop_token_ids=stop_token_ids,
            greedy=greedy,
            ignore_eos=ignore_eos,
        )


@dataclass(frozen=True)
class GenerationRequest:
    """One prompt to continue."""

    prompt_token_ids: tuple[int, ...]
    sampling: SamplingParams


@dataclass(frozen=True)
class GenerationResult:
    """The continuation of one request, token-exact."""

    token_ids: tuple[int, ...]
    """Generated ids, including the stop token when the generation stopped on one."""
    logprobs: tuple[float, ...]
    """Logprob of each generated token under the distribution it was sampled from."""
    finish_reason: FinishReason
    """`stop` (EOS or a stop token) or `length` (max_new_tokens or the context limit)."""
    policy_version: int
    """Weights version that produced the first generated token."""
    last_policy_version: int
    """Weights version that produced the last generated token."""


class SupportsGenerate(Protocol):
    """The one call a rollout needs: a batch of requests in, results in request order out."""

    def generate(self, requests: Sequence[GenerationRequest]) -> list[GenerationResult]: ...


class Generator(Protocol):
    """A generation engine with its own batching, pausing and versioned weights."""

    @property
    def policy_version(self) -> int:
        """Version of the weights currently loaded."""
        ...

    def submit(self, request: GenerationRequest) -> "Future[GenerationResult]":
        """Queue one request; the future resolves when it finishes (or carries the engine's error)."""
        ...

    def generate(self, requests: Sequence[GenerationRequest]) -> list[GenerationResult]:
        """Queue all requests together (so they can share batches) and wait; results are in request order."""
        ...

    def pause(self) -> None:
        """Stop starting new work and return once nothing is decoding; queued requests wait."""
        ...

    def resume(self) -> None:
        """Continue after pause()."""
        ...

    def load_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]], version: int) -> None:
        """Copy new weights in (by parameter name) and set the policy version."""
        ...

    def set_policy_version(self, version: int) -> None:
        """Set the version without copying (colocated engines read the trainer's weights directly)."""
        ...

    def reseed(self, seed: int) -> None:
        """Restart the sampling randomness at `seed` (once per training step, so a resumed run samples alike)."""
        ...

    def counters(self) -> dict[str, float]:
        """The engine's cumulative counters by name (summable over ranks); {} for an engine that keeps none."""
        ...

    def close(self) -> None:
        """Stop the engine's threads; pending requests fail with an error saying the engine closed."""
        ...
