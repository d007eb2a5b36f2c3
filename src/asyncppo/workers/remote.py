"""Driver-side handles over Ray worker groups: the policy and value models of the PPO step, a Generator that
spreads requests over generator ranks, and the weight sync between them.

    driver: ppo_step(RemotePolicy, RemoteValue) ; rollouts(RemoteGenerator) ; WeightSync.push(version)
              |                                          |                          |
          policy hosts (PolicyEndpoint)        generator hosts / colocated      rank 0 -> ranks 1..N
"""

import logging
from collections.abc import Iterable, Sequence
from concurrent.futures import Future
from typing import Any

import torch

from asyncppo.config.runtime import WeightSyncConfig
from asyncppo.distributed.process_group import SyncGroupSpec, WeightSyncError
from asyncppo.distributed.weight_sync import PushReport, check_checksums
from asyncppo.generation.protocol import GenerationRequest, GenerationResult
from asyncppo.types import TrainBatch
from asyncppo.workers.ray_host import WorkerCallError, WorkerGroup

log = logging.getLogger(__name__)
ENGINE_COUNTERS_TIMEOUT_S = 60.0
"""Bound on the per-step counter read: it waits for at most one engine step, so longer means something is off."""


class RemotePolicy:
    """The PolicyModel of the PPO step on a policy worker group (every rank takes part; rank 0 answers)."""

    def __init__(self, group: WorkerGroup):
        self.group = group

    def logprobs(self, batch: TrainBatch) -> torch.Tensor:
        return self.group.call_all("logprobs", batch)[0]

    def reference_logprobs(self, batch: TrainBatch) -> torch.Tensor:
        return self.group.call_all("reference_logprobs", batch)[0]

    def train(self, batch: TrainBatch) -> dict[str, float]:
        return self.group.call_all("train", batch)[0]


class RemoteValue:
    """The ValueModel of the PPO step on a value worker group."""

    def __init__(self, group: WorkerGroup):
        self.group = group

    def values(self, batch: TrainBatch) -> torch.Tensor:
        return self.group.call_all("values", batch)[0]

    def train(
        self,
        batch: TrainBatch,
        offsets: tuple[torch.Tensor, torch.Tensor] | None = None,
        eval_only: bool = False,
    ) -> dict[str, float]:
        return self.group.call_all("train", batch, offsets=offsets, eval_only=eval_only)[0]


class RemoteGenerator:
    """A Generator over the generation ranks (generator hosts, or policy hosts when colocated).

    `generate` splits a request list into contiguous shares, one per rank, so each engine batches its share.
    """

    def __init__(self, group: WorkerGroup):
        self.group = group
        self._next_rank = 0
        self._counters_enabled = True

    def generate(self, requests: Sequence[GenerationRequest]) -> list[GenerationResult]:
        ranks = len(self.group)
        share = -(-len(requests) // ranks)
        chunks = [list(requests[start : start + share]) for start in range(0, len(requests), share)]
        refs = [self.group.submit(rank, "generate", chunk) for rank, chunk in enumerate(chunks)]
        results: list[GenerationResult] = []
        for chunk_results in self.group.gather(refs, "generate", ranks=list(range(len(chunks)))):
            results.extend(chunk_results)
        return results

    def submit(self, request: GenerationRequest) -> "Future[GenerationResult]":
        """One request to the next rank in turn; the future carries its result or the worker's error."""
        rank = self._next_rank
        self._next_rank = (rank + 1) % len(self.group)
        ref = self.group.submit(rank, "generate", [request])
        result: Future[GenerationResult] = Future()

        def unwrap(done: "Future[list[GenerationResult]]") -> None:
            error = done.exception()
            if error is not None:
                result.set_exception(error)
            else:
                result.set_result(done.result()[0])

        ref.future().add_done_callback(unwrap)
        return result

    def set_policy_version(self, version: int) -> None:
        self.group.call_all("set_policy_version", version)

    def reseed(self, seed: int) -> None:
        """Restart every engine's sampling generator (each rank offsets the seed by its rank)."""
        self.group.call_all("reseed", seed)

    def engine_counters(self) -> dict[str, float]:
        """Every rank's cumulative engine counters (`engine_counters` of the endpoints), summed by name.

        One call per rank, gathered together. {} when no engine keeps counters (hf). The counters are only
        diagnostics: a rank that fails to answer (an endpoint without the method, a timeout) turns them off
        for the rest of the run with one warning, instead of stopping training.
        """
        if not self._counters_enabled:
            return {}
        try:
            answers = self.group.gather(
                self.group.submit_all("engine_counters"), "engine_counters", timeout_s=ENGINE_COUNTERS_TIMEOUT_S
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

    def __init__(self, policy: WorkerGroup, generators: WorkerGroup, spec: SyncGroupSpec, settings: WeightSyncConfig):
        self.policy = policy
        self.generators = generators
        self.settings = settings
        self.num_pushes = 0
        specs = policy.call(0, "param_specs")
        # Every participant must join at once: waiting on rank 0 alone would deadlock the rendezvous.
        refs = [policy.submit(0, "open_sync", spec, settings.bucket_size_bytes)]
        refs += [
            generators.submit(rank, "open_sync", spec, rank + 1, specs, settings.bucket_size_bytes)
            for rank in range(len(generators))
        ]
        self._gather(refs, "open_sync", spec.timeout_s + 30)

    def push(self, version: int) -> PushReport:
        """Broadcast the current policy as `version`; compare checksums every checksum_period pushes."""
        self.num_pushes += 1
        period = self.settings.checksum_period
        check = period > 0 and self.num_pushes % period == 0
        refs = [self.policy.submit(0, "push_weights", version, check)]
        refs += [
            self.generators.submit(rank, "receive_weights", version, check) for rank in range(len(self.generators))
        ]
        report, *checksums = self._gather(refs, "push", self.settings.timeout_s + 30)
        assert isinstance(report, PushReport)
        if check:
            assert report.checksum is not None
            received = {rank + 1: str(value) for rank, value in enumerate(checksums)}
            check_checksums(report.checksum, received, version)
        return report

    def _gather(self, refs: Iterable[Any], what: str, timeout_s: float) -> list[Any]:
        import ray
        from ray.exceptions import GetTimeoutError, RayTaskError

        try:
            return list(ray.get(list(refs), timeout=timeout_s))
        except GetTimeoutError:
            raise WeightSyncError(f"weight sync {what} did not finish within {timeout_s:.0f} s") from None
        except RayTaskError as error:
            cause = error.cause if isinstance(error.cause, BaseException) else error
            raise WeightSyncError(f"weight sync {what} failed: {type(cause).__name__}: {cause}") from error
