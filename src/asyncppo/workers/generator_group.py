"""GeneratorGroup: the run's generation ranks behind one Generator (generator workers, or the policy workers when
generation is colocated), used by rollouts, the gym's policy servers and the driver's per-step counters.

    rollouts --generate(requests) / submit(request)--> GeneratorGroup --> GenerationWorker rank 0..N-1
"""

import logging
from collections.abc import Iterable, Sequence
from concurrent.futures import Future
from typing import TYPE_CHECKING, Protocol

import torch

from asyncppo.generation.protocol import GenerationRequest, GenerationResult
from asyncppo.workers.ray_host import WorkerCallError, WorkerGroup

if TYPE_CHECKING:  # the HTTP stack (fastapi, uvicorn) is imported only by runs that serve the gym
    from asyncppo.workers.policy_http import PolicyServerSettings

log = logging.getLogger(__name__)
ENGINE_COUNTERS_TIMEOUT_S = 60.0
"""Bound on the per-step counter read: it waits for at most one engine step, so longer means something is off."""


class GenerationWorker(Protocol):
    """What a generation rank answers: a GeneratorWorker, or a colocated PolicyWorker."""

    def generate(self, requests: Sequence[GenerationRequest]) -> list[GenerationResult]: ...

    def set_policy_version(self, version: int) -> None: ...

    def reseed(self, seed: int) -> None: ...

    def engine_counters(self) -> dict[str, float]: ...

    def serve_http(self, settings: "PolicyServerSettings") -> str: ...

    def policy_version(self) -> int: ...

    def weights(self) -> dict[str, torch.Tensor]: ...


class GeneratorGroup:
    """A Generator over the generation ranks (generator workers, or the policy workers when colocated).

    `generate` splits a request list into contiguous shares, one per rank, so each engine batches its share.
    """

    def __init__(self, group: WorkerGroup[GenerationWorker]):
        self.group = group
        self._next_rank = 0
        self._counters_enabled = True

    def generate(self, requests: Sequence[GenerationRequest]) -> list[GenerationResult]:
        ranks = len(self.group)
        share = -(-len(requests) // ranks)
        chunks = [list(requests[start : start + share]) for start in range(0, len(requests), share)]
        calls = [self.group.submit(rank, GenerationWorker.generate, chunk) for rank, chunk in enumerate(chunks)]
        results: list[GenerationResult] = []
        for chunk_results in self.group.gather(calls):
            results.extend(chunk_results)
        return results

    def submit(self, request: GenerationRequest) -> "Future[GenerationResult]":
        """One request to the next rank in turn; the future carries its result or the worker's error."""
        rank = self._next_rank
        self._next_rank = (rank + 1) % len(self.group)
        call = self.group.submit(rank, GenerationWorker.generate, [request])
        result: Future[GenerationResult] = Future()

        def unwrap(done: "Future[list[GenerationResult]]") -> None:
            error = done.exception()
            if error is not None:
                result.set_exception(error)
            else:
                result.set_result(done.result()[0])

        call.ref.future().add_done_callback(unwrap)
        return result

    def set_policy_version(self, version: int) -> None:
        self.group.call_all(GenerationWorker.set_policy_version, version)

    def reseed(self, seed: int) -> None:
        """Restart every engine's sampling generator (each rank offsets the seed by its rank)."""
        self.group.call_all(GenerationWorker.reseed, seed)

    def serve_http(self, settings: "PolicyServerSettings") -> list[str]:
        """Serve every rank's engine to gym agents; their OpenAI base URLs in rank order."""
        return self.group.call_all(GenerationWorker.serve_http, settings)

    def policy_version(self, rank: int = 0) -> int:
        """The weight version `rank`'s engine generates with."""
        return self.group.call(rank, GenerationWorker.policy_version)

    def weights(self, rank: int = 0) -> dict[str, torch.Tensor]:
        """CPU copies of `rank`'s engine weights (for inspection and tests)."""
        return self.group.call(rank, GenerationWorker.weights)

    def engine_counters(self) -> dict[str, float]:
        """Every rank's cumulative engine counters (`engine_counters` of the workers), summed by name.

        One call per rank, gathered together. {} when no engine keeps counters (hf). The counters are only
        diagnostics: a rank that fails to answer (a worker without the method, a timeout) turns them off
        for the rest of the run with one warning, instead of stopping training.
        """
        if not self._counters_enabled:
            return {}
        try:
            answers = self.group.gather(
                self.group.submit_all(GenerationWorker.engine_counters), timeout_s=ENGINE_COUNTERS_TIMEOUT_S
            )
        except WorkerCallError as error:
            self._counters_enabled = False
            log.warning("generation engine counters are not reported from now on: %s", error)
            return {}
        return sum_counters(answers)


def sum_counters(answers: Iterable[dict[str, float]]) -> dict[str, float]:
    """Per-rank counter dicts summed by name (a name missing from a rank counts 0 there)."""
    total: dict[str, float] = {}
    for answer in answers:
        for name, value in answer.items():
            total[name] = total.get(name, 0.0) + float(value)
    return total
