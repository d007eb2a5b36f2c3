"""GeneratorGroup: the run's generation ranks behind one Generator (generator workers, or the policy workers when
generation is colocated), used by rollouts, the gym's policy servers and the driver's per-step counters.

    rollouts --generate(requests) / submit(request)--> GeneratorGroup --least loaded--> GenerationWorker rank 0..N-1
                                                             | a rank's process died
                                                             +--report_death--> GeneratorSupervisor (restarts it)

Without a supervisor (colocated generation: the ranks are the policy workers) a dead rank's WorkerDiedError ends the
run; with one, the call raises GenerationInterrupted and the batch source runs its groups again once the rank is back.
"""

import logging
import threading
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any, Protocol, TypeVar, cast

import torch
from ray.exceptions import RayActorError

from asyncppo.generation.protocol import GenerationRequest, GenerationResult
from asyncppo.pipeline.errors import GenerationInterrupted
from asyncppo.workers.ray_host import (
    PendingCall,
    WorkerCallError,
    WorkerDiedError,
    WorkerGroup,
    death_cause,
    named_worker_error,
)

if TYPE_CHECKING:  # the HTTP stack (fastapi, uvicorn) is imported only by runs that serve the gym
    from asyncppo.workers.policy_http import PolicyServerSettings

log = logging.getLogger(__name__)
ENGINE_COUNTERS_TIMEOUT_S = 60.0
"""Bound on the per-step counter read: it waits for at most one engine step, so longer means something is off."""
Answer = TypeVar("Answer")


class DeathListener(Protocol):
    """Told of every generator process found dead (the GeneratorSupervisor restarts it)."""

    def report_death(self, rank: int, host: Any, cause: str) -> None:
        """`rank`'s process `host` died (a report about a host already replaced is ignored)."""
        ...


class GenerationWorker(Protocol):
    """What a generation rank answers: a GeneratorWorker, or a colocated PolicyWorker."""

    def generate(self, requests: Sequence[GenerationRequest]) -> list[GenerationResult]: ...

    def set_policy_version(self, version: int) -> None: ...

    def reseed(self, seed: int) -> None: ...

    def engine_counters(self) -> dict[str, float]: ...

    def serve_http(self, settings: "PolicyServerSettings") -> str: ...

    def policy_requests_received(self) -> int: ...

    def policy_version(self) -> int: ...

    def weights(self) -> dict[str, torch.Tensor]: ...


class GeneratorGroup:
    """A Generator over the generation ranks (generator workers, or the policy workers when colocated).

    Requests go to the least-loaded rank: the group counts the requests it has sent to each rank and not yet
    had answered (callers share it from many threads: collector threads call `generate`, a policy server's
    event loop calls `submit`), and a count drops when the rank answers, with results or an error. A rank that
    died fails every call routed to it at once instead of stalling it: with a death listener (`watch_deaths`), as
    GenerationInterrupted after reporting the death; without one, with the WorkerDiedError that names it.

    It also remembers what a restarted rank must be given again: the sampling seed and the policy servers' settings
    and URLs.
    """

    def __init__(self, group: WorkerGroup[GenerationWorker]):
        self.group = group
        self.seed: int | None = None
        """The last `reseed` seed (None before any)."""
        self.http: tuple[PolicyServerSettings, list[str]] | None = None
        """The settings and URLs `serve_http` served with (None: not served)."""
        self._deaths: DeathListener | None = None
        self._lock = threading.Lock()
        self._in_flight = [0] * len(group)
        # Where the search for the least-loaded rank starts; it moves past each choice. Ties then rotate: lone
        # calls at light load (every rank idle, so all tied) take the ranks in turn instead of all landing on
        # rank 0, which would leave the other engines idle.
        self._next_rank = 0
        self._counters_enabled = True
        # Per rank: the last counters read and the sum of those its earlier processes reached (a restarted engine
        # counts from 0 again; the group's counters stay cumulative).
        self._last_counters: list[dict[str, float]] = [{} for _ in range(len(group))]
        self._counters_before_restart: list[dict[str, float]] = [{} for _ in range(len(group))]

    def watch_deaths(self, listener: DeathListener) -> None:
        """Report every dead rank to `listener` (and raise GenerationInterrupted from the call that found it)."""
        self._deaths = listener

    def in_flight(self) -> list[int]:
        """Requests sent to each rank and not answered yet, in rank order."""
        with self._lock:
            return list(self._in_flight)

    def generate(self, requests: Sequence[GenerationRequest]) -> list[GenerationResult]:
        """Results in request order.

        The requests are cut into units of consecutive requests with the same prompt (a prompt group's samples),
        and each unit goes whole to the rank with the fewest requests in flight (counting the units this call
        has already given it), so one engine sees a group's shared prompt and reuses its prefix. Each rank gets
        one call with its units in request order (with one rank: the whole list, as given).
        """
        units = prompt_units(requests)
        ranks = self._route([len(unit) for unit in units])
        shares: list[list[int]] = [[] for _ in range(len(self.group))]
        for unit, rank in zip(units, ranks, strict=True):
            shares[rank].extend(unit)
        calls: list[tuple[list[int], PendingCall[list[GenerationResult]]]] = []
        hosts = list(self.group.hosts)  # as the calls go out: a death report names the process that died
        for rank, positions in enumerate(shares):
            if not positions:
                continue
            try:
                call, _ = self._start(rank, [requests[position] for position in positions])
            except BaseException:
                for later_rank in range(rank, len(shares)):  # not started: nothing will answer for them
                    self._release(later_rank, len(shares[later_rank]))
                raise
            calls.append((positions, call))
        try:
            answers = self.group.gather([call for _, call in calls])
        except WorkerDiedError as died:
            raise self._interrupted(died, hosts[died.rank]) from died
        results: list[GenerationResult | None] = [None] * len(requests)
        for (positions, _), share_results in zip(calls, answers, strict=True):
            for position, result in zip(positions, share_results, strict=True):
                results[position] = result
        assert None not in results, "every request is in exactly one share"
        return cast(list[GenerationResult], results)

    def submit(self, request: GenerationRequest) -> "Future[GenerationResult]":
        """One request to the least-loaded rank; the future carries its result, or a WorkerCallError that names
        the rank and says what happened (the worker died, or the call failed and why)."""
        (rank,) = self._route([1])
        host = self.group.hosts[rank]
        _, done = self._start(rank, [request])
        result: Future[GenerationResult] = Future()
        where = f"{self.group.name}[{rank}].generate"

        def unwrap(done: "Future[list[GenerationResult]]") -> None:
            error = done.exception()
            named = None if error is None else named_worker_error(where, error)
            if named is not None and self._deaths is not None and isinstance(error, RayActorError):
                self._deaths.report_death(rank, host, death_cause(error))
                named = GenerationInterrupted(f"{named}; its requests run again once it is back")
            if named is not None:
                result.set_exception(named)
            else:
                result.set_result(done.result()[0])

        done.add_done_callback(unwrap)
        return result

    def _route(self, unit_sizes: Sequence[int]) -> list[int]:
        """The rank of each unit, taken in order: the one with the fewest requests in flight, which then counts
        the unit's requests as in flight (so the next unit of the same call sees them)."""
        with self._lock:
            num_ranks = len(self._in_flight)
            ranks = []
            for size in unit_sizes:
                search_order = [(self._next_rank + offset) % num_ranks for offset in range(num_ranks)]
                rank = min(search_order, key=self._in_flight.__getitem__)  # the first of the least loaded
                self._next_rank = (rank + 1) % num_ranks
                self._in_flight[rank] += size
                ranks.append(rank)
            return ranks

    def _start(
        self, rank: int, requests: list[GenerationRequest]
    ) -> "tuple[PendingCall[list[GenerationResult]], Future[list[GenerationResult]]]":
        """Start `generate` on `rank`; its requests leave the in-flight count when the rank answers. Returns the
        call (for `gather`) and a future of its answer, on which the count has already dropped."""
        call = self.group.submit(rank, GenerationWorker.generate, requests)
        done: Future[list[GenerationResult]] = call.ref.future()
        done.add_done_callback(lambda _: self._release(rank, len(requests)))
        return call, done

    def _interrupted(self, died: WorkerDiedError, host: Any) -> BaseException:
        """What a call that found `died` raises: GenerationInterrupted once the death is reported, or (nobody to
        report to) the death itself."""
        if self._deaths is None:
            return died
        self._deaths.report_death(died.rank, host, died.cause)
        return GenerationInterrupted(
            f"generator rank {died.rank} died with requests of this call in flight: {died.cause}"
        )

    def _every_rank(self, method: Callable[..., Answer], *args: Any) -> list[Answer | None]:
        """`method` on every rank, answers in rank order; with a death listener, a dead rank is reported and
        answers None (a restarted rank is given the run's state again by the supervisor)."""
        hosts = list(self.group.hosts)
        answers: list[Answer | None] = []
        for call in self.group.submit_all(method, *args):
            try:
                answers.append(self.group.gather([call])[0])
            except WorkerDiedError as died:
                if self._deaths is None:
                    raise
                self._deaths.report_death(died.rank, hosts[died.rank], died.cause)
                answers.append(None)
        return answers

    def _release(self, rank: int, num_requests: int) -> None:
        with self._lock:
            self._in_flight[rank] -= num_requests
            assert self._in_flight[rank] >= 0, f"rank {rank} answered more requests than it was sent"

    def set_policy_version(self, version: int) -> None:
        self._every_rank(GenerationWorker.set_policy_version, version)

    def reseed(self, seed: int) -> None:
        """Restart every engine's sampling generator (each rank offsets the seed by its rank)."""
        self.seed = seed
        self._every_rank(GenerationWorker.reseed, seed)

    def serve_http(self, settings: "PolicyServerSettings") -> list[str]:
        """Serve every rank's engine to gym agents; their OpenAI base URLs in rank order."""
        urls = self.group.call_all(GenerationWorker.serve_http, settings)
        self.http = (settings, urls)
        return urls

    def policy_requests_received(self) -> int:
        """HTTP requests the ranks' policy servers have received, summed (WorkerCallError when a rank fails)."""
        return sum(self.group.call_all(GenerationWorker.policy_requests_received))

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
        except WorkerDiedError:
            if self._deaths is None:
                raise
            return {}  # read again next step, once the rank is restarted (its death is the supervisor's to find)
        except WorkerCallError as error:
            self._counters_enabled = False
            log.warning("generation engine counters are not reported from now on: %s", error)
            return {}
        return sum_counters(self._carried_over_restarts(answers))

    def _carried_over_restarts(self, answers: list[dict[str, float]]) -> list[dict[str, float]]:
        """Each rank's counters since the run started: a rank whose counters went down was restarted, so what its
        earlier processes counted is added to what the new one counts."""
        totals = []
        for rank, answer in enumerate(answers):
            last = self._last_counters[rank]
            if any(answer.get(name, 0.0) < value for name, value in last.items()):
                self._counters_before_restart[rank] = sum_counters([self._counters_before_restart[rank], last])
            self._last_counters[rank] = answer
            totals.append(sum_counters([self._counters_before_restart[rank], answer]))
        return totals


def prompt_units(requests: Sequence[GenerationRequest]) -> list[range]:
    """Positions of each run of consecutive requests with the same prompt token ids, in order."""
    units: list[range] = []
    start = 0
    for position in range(1, len(requests) + 1):
        if position == len(requests) or requests[position].prompt_token_ids != requests[start].prompt_token_ids:
            units.append(range(start, position))
            start = position
    return units


def sum_counters(answers: Iterable[dict[str, float]]) -> dict[str, float]:
    """Per-rank counter dicts summed by name (a name missing from a rank counts 0 there)."""
    total: dict[str, float] = {}
    for answer in answers:
        for name, value in answer.items():
            total[name] = total.get(name, 0.0) + float(value)
    return total
