"""The typed facade over the run's Ray worker groups, one class per role, and the weight sync between them.
This module (with the transport in `ray_host.py`) is the only place that names worker methods for remote calls;
the trainer, scripts and tests call the typed methods below.

    driver: ppo_step(PolicyGroup, ValueGroup) ; rollouts(GeneratorGroup) ; WeightSync.push(version)
                 |            |                          |                          |
           PolicyWorker   ValueWorker      GeneratorWorker ranks (or the      rank 0 -> ranks 1..N
                                           colocated PolicyWorker)

`PolicyModel` and `ValueModel` are what the PPO step needs of the policy and the critic: the groups here, the
in-process workers and the test fakes all provide them.
"""

import logging
from collections.abc import Iterable, Sequence
from concurrent.futures import Future
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import torch

from asyncppo.config.runtime import WeightSyncConfig
from asyncppo.distributed.process_group import SyncGroupSpec, WeightSyncError
from asyncppo.distributed.weight_sync import PushReport, check_checksums
from asyncppo.generation.protocol import GenerationRequest, GenerationResult
from asyncppo.types import TrainBatch
from asyncppo.workers.generator_worker import GeneratorWorker
from asyncppo.workers.policy_worker import PolicyWorker
from asyncppo.workers.ray_host import PendingCall, WorkerCallError, WorkerGroup
from asyncppo.workers.value_worker import Offsets, ValueWorker

if TYPE_CHECKING:  # the HTTP stack (fastapi, uvicorn) is imported only by runs that serve the gym
    from asyncppo.workers.policy_http import PolicyServerSettings

log = logging.getLogger(__name__)
ENGINE_COUNTERS_TIMEOUT_S = 60.0
"""Bound on the per-step counter read: it waits for at most one engine step, so longer means something is off."""


class PolicyModel(Protocol):
    """The policy side of a PPO step."""

    def logprobs(self, batch: TrainBatch) -> torch.Tensor: ...

    def reference_logprobs(self, batch: TrainBatch) -> torch.Tensor: ...

    def train(self, batch: TrainBatch) -> dict[str, float]: ...


class ValueModel(Protocol):
    """The critic side of a PPO step: `train` takes an optimizer pass, `evaluate` only re-scores."""

    def values(self, batch: TrainBatch) -> torch.Tensor: ...

    def train(self, batch: TrainBatch, offsets: Offsets | None = None) -> dict[str, float]: ...

    def evaluate(self, batch: TrainBatch, offsets: Offsets | None = None) -> dict[str, float]: ...


class GenerationWorker(Protocol):
    """What a generation rank answers: a GeneratorWorker, or a colocated PolicyWorker."""

    def generate(self, requests: Sequence[GenerationRequest]) -> list[GenerationResult]: ...

    def set_policy_version(self, version: int) -> None: ...

    def reseed(self, seed: int) -> None: ...

    def engine_counters(self) -> dict[str, float]: ...

    def serve_http(self, settings: "PolicyServerSettings") -> str: ...

    def policy_version(self) -> int: ...

    def weights(self) -> dict[str, torch.Tensor]: ...


class PolicyGroup:
    """The policy workers (every rank takes part in each call; rank 0 answers)."""

    def __init__(self, group: WorkerGroup[PolicyWorker]):
        self.group = group

    def logprobs(self, batch: TrainBatch) -> torch.Tensor:
        return self.group.call_all(PolicyWorker.logprobs, batch)[0]

    def reference_logprobs(self, batch: TrainBatch) -> torch.Tensor:
        return self.group.call_all(PolicyWorker.reference_logprobs, batch)[0]

    def train(self, batch: TrainBatch) -> dict[str, float]:
        return self.group.call_all(PolicyWorker.train, batch)[0]

    def save(self, directory: Path) -> None:
        """Rank 0 writes the policy checkpoint into `directory`."""
        self.group.call(0, PolicyWorker.save, directory)

    def load(self, directory: Path) -> None:
        """Every rank loads weights, optimizer and scheduler from a `save` directory (resume)."""
        self.group.call_all(PolicyWorker.load, directory)

    def weights(self) -> dict[str, torch.Tensor]:
        """CPU copies of rank 0's weights as pushed (for inspection and tests)."""
        return self.group.call(0, PolicyWorker.weights)


class ValueGroup:
    """The value (critic) workers."""

    def __init__(self, group: WorkerGroup[ValueWorker]):
        self.group = group

    def values(self, batch: TrainBatch) -> torch.Tensor:
        return self.group.call_all(ValueWorker.values, batch)[0]

    def train(self, batch: TrainBatch, offsets: Offsets | None = None) -> dict[str, float]:
        return self.group.call_all(ValueWorker.train, batch, offsets)[0]

    def evaluate(self, batch: TrainBatch, offsets: Offsets | None = None) -> dict[str, float]:
        return self.group.call_all(ValueWorker.evaluate, batch, offsets)[0]

    def save(self, directory: Path) -> None:
        """Rank 0 writes the critic checkpoint into `directory`."""
        self.group.call(0, ValueWorker.save, directory)

    def load(self, directory: Path) -> None:
        """Every rank loads weights, optimizer and scheduler from a `save` directory (resume)."""
        self.group.call_all(ValueWorker.load, directory)

    def warm_start(self, directory: str) -> None:
        """Every rank loads critic weights from `directory` with a fresh optimizer and schedule."""
        self.group.call_all(ValueWorker.warm_start, directory)


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


class WeightSync:
    """Pushes the policy from policy rank 0 to every generator rank and verifies the copies."""

    def __init__(
        self,
        policy: WorkerGroup[PolicyWorker],
        generators: WorkerGroup[GeneratorWorker],
        spec: SyncGroupSpec,
        settings: WeightSyncConfig,
    ):
        self.policy = policy
        self.generators = generators
        self.settings = settings
        self.num_pushes = 0
        specs = policy.call(0, PolicyWorker.param_specs)
        # Every participant must join at once: waiting on rank 0 alone would deadlock the rendezvous.
        calls: list[PendingCall[None]] = [policy.submit(0, PolicyWorker.open_sync, spec, settings.bucket_size_bytes)]
        calls += [
            generators.submit(rank, GeneratorWorker.open_sync, spec, rank + 1, specs, settings.bucket_size_bytes)
            for rank in range(len(generators))
        ]
        self._gather(calls, "open_sync", spec.timeout_s + 30)

    def push(self, version: int) -> PushReport:
        """Broadcast the current policy as `version`; compare checksums every checksum_period pushes."""
        self.num_pushes += 1
        period = self.settings.checksum_period
        check = period > 0 and self.num_pushes % period == 0
        calls: list[PendingCall[Any]] = [self.policy.submit(0, PolicyWorker.push_weights, version, check)]
        calls += [
            self.generators.submit(rank, GeneratorWorker.receive_weights, version, check)
            for rank in range(len(self.generators))
        ]
        report, *checksums = self._gather(calls, "push", self.settings.timeout_s + 30)
        assert isinstance(report, PushReport)
        if check:
            assert report.checksum is not None
            received = {rank + 1: str(value) for rank, value in enumerate(checksums)}
            check_checksums(report.checksum, received, version)
        return report

    def _gather(self, calls: Iterable[PendingCall[Any]], what: str, timeout_s: float) -> list[Any]:
        import ray
        from ray.exceptions import GetTimeoutError, RayTaskError

        try:
            return list(ray.get([call.ref for call in calls], timeout=timeout_s))
        except GetTimeoutError:
            raise WeightSyncError(f"weight sync {what} did not finish within {timeout_s:.0f} s") from None
        except RayTaskError as error:
            cause = error.cause if isinstance(error.cause, BaseException) else error
            raise WeightSyncError(f"weight sync {what} failed: {type(cause).__name__}: {cause}") from error
