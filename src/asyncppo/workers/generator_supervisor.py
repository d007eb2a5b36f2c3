"""GeneratorSupervisor: keeps the run's generator processes serving. A generator whose process dies is restarted in
its own slot (within generation.max_restarts, after a back-off) and brought to the published weights before it
serves; the batch sources ask it (`GenerationHealth`) whether a failed rollout lost its requests to a death, and run
those groups again. It pushes every weight version on the driver's behalf, so a push and a restart never overlap.

    death noticed: a call into the rank failed (GeneratorGroup), the watch's ping failed, a push or reconnect broke
        off --> rank down, deaths + 1 (no rollout starts until every rank serves; those in flight run again)
    restarter thread: one console line, back-off (1 s, doubled for each quick repeat, at most 30 s) --> a fresh
        host in the slot, its worker built from the same factory, its policy server on the old port, the last
        seed --> rank built, not yet synced
    weights: at the driver's next publish (the new version goes to every rank), or sooner while the trainer is
        idle (the driver waits for a batch or validates, `trainer_idle`): a fresh sync group with every rank, the
        published version pushed and checksummed --> serving
    a death while starting or receiving weights is one more restart; past max_restarts, or a trainer rank found
        dead after a push broke off: the run ends with one line (WorkerDiedError)

The trainer's weights are exactly the published version only while it is idle (from a publish until the next
training step): that is why a catch-up push waits for `trainer_idle` or for the driver's publish.
"""

import logging
import threading
import time
from collections.abc import Callable, Generator
from contextlib import contextmanager
from typing import Any
from urllib.parse import urlsplit

import ray
from ray.exceptions import RayActorError, RayError

from asyncppo.distributed.process_group import WeightSyncError
from asyncppo.distributed.weight_sync import PushReport
from asyncppo.pipeline.errors import RunEndingError, step_number
from asyncppo.workers.generator_group import GeneratorGroup
from asyncppo.workers.generator_worker import GeneratorWorker
from asyncppo.workers.groups import WeightSync
from asyncppo.workers.ray_host import (
    RESUME_HINT,
    WorkerCallError,
    WorkerDiedError,
    WorkerGroup,
    abandon,
    death_cause,
)

log = logging.getLogger(__name__)

BACKOFF_START_S = 1.0
BACKOFF_MAX_S = 30.0
QUICK_REPEAT_S = 60.0
"""A rank restarted again within this many seconds of its last restart waits twice as long as last time."""
BUILD_TIMEOUT_S = 600.0
"""The longest a restarted generator may take to start and load its model."""
WATCH_INTERVAL_S = 1.0
"""How often every generator process is pinged, so a death is noticed without a call into it (gym traffic reaches
the generators over HTTP, not through the driver)."""
PROBE_TIMEOUT_S = 5.0
"""How long a probe waits for pings; a process that does not answer in time (busy) counts as alive."""


class GeneratorSupervisor:
    """Restarts dead generator processes and pushes weights; see the module docstring. Satisfies GenerationHealth."""

    def __init__(self, generators: GeneratorGroup, weight_sync: WeightSync, max_restarts: int) -> None:
        if max_restarts < 0:
            raise ValueError(f"max_restarts must be >= 0, got {max_restarts}")
        self.generators = generators
        self.weight_sync = weight_sync
        self.max_restarts = max_restarts
        self._condition = threading.Condition()
        self._down: dict[int, str] = {}
        """Ranks waiting for a restart, with the cause of their death."""
        self._unsynced: set[int] = set()
        """Ranks restarted and built, without the published weights yet."""
        self._reconnect = False
        """The sync group must be opened afresh before the next push (a push or reconnect broke off)."""
        self._deaths = 0
        self._restarts = 0
        self._published = 0
        self._failure: Exception | None = None
        self._trainer_idle = False
        self._catching_up = False
        self._stopping = False
        self._last_restart: dict[int, float] = {}
        self._quick_repeats: dict[int, int] = {}
        self._pings: dict[int, tuple[Any, Any]] = {}
        self.on_restart: Callable[[int, int | None], None] | None = None
        """Called with (rank, new process id) once a restarted rank is built (the run records its process id)."""
        generators.watch_deaths(self)
        self._thread = threading.Thread(target=self._run, name="generator-supervisor", daemon=True)
        self._thread.start()

    # ---- the driver's side -------------------------------------------------------------------------------
    @property
    def restarts(self) -> int:
        """Generator restarts begun since the run started (the metric generation/restarts)."""
        with self._condition:
            return self._restarts

    def publish(self, version: int, trained: bool) -> PushReport | None:
        """Make every generator hold `version`: push the trainer's weights (when it trained, or when a restarted rank
        has none yet; checksums are then compared), else only set the version. Waits for ranks being restarted; a
        generator that dies meanwhile is restarted and the push repeated. Called by the driver, never while it
        is idle (the trainer's weights are the ones to publish)."""
        while True:
            unsynced, reconnect = self._wait_until_built()
            try:
                if unsynced or reconnect:
                    self.weight_sync.reconnect()
                report = None
                if trained or unsynced:
                    report = self.weight_sync.push(version, check=True if unsynced else None)
                else:
                    self.generators.set_policy_version(version)
            except (WeightSyncError, WorkerCallError) as error:
                self._after_sync_failure(error)
                continue
            with self._condition:
                if not self._down:  # a death found by set_policy_version leaves its rank to the next publish
                    self._published = version
                    self._unsynced -= unsynced
                    self._condition.notify_all()
                    return report
                self._published = version

    @contextmanager
    def trainer_idle(self) -> Generator[None]:
        """The driver's side while it only waits for rollouts (a batch, a validation): the trainer's weights are the
        published ones, so a restarted generator may be given them now. Leaving waits for such a push to end."""
        with self._condition:
            self._trainer_idle = True
            self._condition.notify_all()
        try:
            yield
        finally:
            with self._condition:
                self._trainer_idle = False
                self._condition.wait_for(lambda: not self._catching_up)

    def stop(self, timeout_s: float = 30.0) -> None:
        """Stop watching and restarting (before the run ends its processes, whose ends are no deaths)."""
        with self._condition:
            self._stopping = True
            self._condition.notify_all()
        self._thread.join(timeout=timeout_s)
        if self._thread.is_alive():
            log.warning("generator supervisor: still restarting a generator %.0f s after the run ended", timeout_s)

    # ---- GenerationHealth (the batch sources) --------------------------------------------------------------
    def deaths(self) -> int:
        with self._condition:
            return self._deaths

    def lost_requests_since(self, deaths: int) -> bool:
        with self._condition:
            if self._deaths > deaths or self._down or self._unsynced:
                return True
        for rank, (host, cause) in self._probe(self.generators.group).items():
            self.report_death(rank, host, cause)
        with self._condition:
            return self._deaths > deaths

    def serving(self) -> bool:
        with self._condition:
            return not self._down and not self._unsynced

    def failure(self) -> Exception | None:
        with self._condition:
            return self._failure

    def wait_until_serving(self) -> None:
        with self._condition:
            self._condition.wait_for(
                lambda: self._failure is not None or self._stopping or not (self._down or self._unsynced)
            )
            if self._failure is not None:
                raise self._failure
            if self._stopping:
                raise RuntimeError("the run is ending: its generators are no longer restarted")

    # ---- deaths ----------------------------------------------------------------------------------------------
    def report_death(self, rank: int, host: Any, cause: str) -> None:
        """`rank`'s process `host` died: restart it (a report about a host already replaced, or already down, is
        ignored)."""
        with self._condition:
            if self._stopping or self.generators.group.hosts[rank] is not host or rank in self._down:
                return
            self._deaths += 1
            self._down[rank] = cause
            self._unsynced.discard(rank)
            self._reconnect = True
            self._condition.notify_all()

    def _after_sync_failure(self, error: Exception) -> None:
        """A reconnect or push broke off: the dead generators found are restarted (the caller repeats the push); a
        dead trainer rank, or no death at all (the sync's own failure), ends the run with `error`'s account."""
        with self._condition:
            self._reconnect = True
        policy = self.weight_sync.policy
        dead_policy = self._probe(policy)
        if dead_policy:
            rank, (_, cause) = min(dead_policy.items())
            raise WorkerDiedError(policy.name, rank, policy.pids[rank], cause) from error
        generators = self.generators.group
        dead = self._probe(generators)
        if isinstance(error, WorkerDiedError) and error.role == generators.name:
            # No restart runs while the weights move, so the rank's host is still the one that died.
            dead.setdefault(error.rank, (generators.hosts[error.rank], error.cause))
        for rank, (host, cause) in dead.items():
            self.report_death(rank, host, cause)
        if not dead:
            raise error

    def _probe(self, group: WorkerGroup[Any]) -> dict[int, tuple[Any, str]]:
        """The ranks of `group` whose processes are dead now, with their hosts and causes (one ping each)."""
        hosts = list(group.hosts)
        pings = [host.location.remote() for host in hosts]
        ray.wait(pings, num_returns=len(pings), timeout=PROBE_TIMEOUT_S)
        dead: dict[int, tuple[Any, str]] = {}
        for rank, (host, ping) in enumerate(zip(hosts, pings, strict=True)):
            if not ray.wait([ping], timeout=0)[0]:
                abandon([ping])  # busy, so alive
                continue
            try:
                ray.get(ping)
            except RayActorError as error:
                dead[rank] = (host, death_cause(error))
        return dead

    def _watch(self) -> None:
        """One ping in flight per generator process; a ping answered by the process's death reports it."""
        for rank, host in enumerate(list(self.generators.group.hosts)):
            ping = self._pings.get(rank)
            if ping is None or ping[0] is not host:
                if ping is not None:
                    abandon([ping[1]])  # its host was replaced
                self._pings[rank] = (host, host.location.remote())
                continue
            if not ray.wait([ping[1]], timeout=0)[0]:
                continue
            del self._pings[rank]
            try:
                ray.get(ping[1])
            except RayActorError as error:
                self.report_death(rank, host, death_cause(error))
            except RayError as error:  # not a death: the next ping asks again
                log.debug("generator rank %d: ping failed: %s", rank, error)

    # ---- the restarter thread ------------------------------------------------------------------------------
    def _run(self) -> None:
        try:
            while True:
                with self._condition:
                    self._condition.wait_for(self._has_work, timeout=WATCH_INTERVAL_S)
                    if self._stopping or self._failure is not None:
                        return
                    rank = min(self._down) if self._down else None
                    catch_up = rank is None and bool(self._unsynced) and self._trainer_idle
                    self._catching_up = catch_up
                try:
                    if rank is not None:
                        self._restart(rank)
                    elif catch_up:
                        self._catch_up()
                    self._watch()
                finally:
                    if catch_up:
                        with self._condition:
                            self._catching_up = False
                            self._condition.notify_all()
        except Exception as error:  # the failure channel: every caller waiting on the generators gets it
            with self._condition:
                self._failure = error
                self._condition.notify_all()
        finally:
            abandon([ping for _, ping in self._pings.values()])

    def _has_work(self) -> bool:
        return (
            self._stopping
            or self._failure is not None
            or bool(self._down)
            or (bool(self._unsynced) and self._trainer_idle)
        )

    def _restart(self, rank: int) -> None:
        group = self.generators.group
        with self._condition:
            cause, pid, step = self._down[rank], group.pids[rank], step_number(self._published)
            if self._restarts >= self.max_restarts:
                used_up = (
                    "generation.max_restarts=0: generators are not restarted"
                    if self.max_restarts == 0
                    else f"all generation.max_restarts={self.max_restarts} restarts are used up"
                )
                self._failure = WorkerDiedError("generator", rank, pid, cause, step, f"{used_up}; {RESUME_HINT}")
                self._condition.notify_all()
                return
            self._restarts += 1
            count, delay = self._restarts, self._backoff(rank)
        process = f", pid {pid}" if pid is not None else ""
        print(
            f"generator rank {rank}{process} died during step {step}: {cause}; restarting it in {delay:g} s "
            f"(restart {count} of generation.max_restarts={self.max_restarts})",
            flush=True,
        )
        with self._condition:
            if self._condition.wait_for(lambda: self._stopping, timeout=delay):
                return
        try:
            self.weight_sync.generators.replace(rank, BUILD_TIMEOUT_S)
            self._give_back_state(rank)
        except WorkerDiedError as died:  # died again before it served: one more restart
            with self._condition:
                self._deaths += 1
                self._down[rank] = died.cause
            return
        with self._condition:
            del self._down[rank]
            self._unsynced.add(rank)
            self._condition.notify_all()
        if self.on_restart is not None:
            self.on_restart(rank, group.pids[rank])
        log.info(
            "generator rank %d restarted as pid %s; it serves once it has the published weights", rank, group.pids[rank]
        )

    def _backoff(self, rank: int) -> float:
        """1 s, doubled for every restart of the rank that follows its previous one within QUICK_REPEAT_S."""
        now = time.monotonic()
        last = self._last_restart.get(rank)
        repeats = self._quick_repeats.get(rank, 0) + 1 if last is not None and now - last < QUICK_REPEAT_S else 0
        self._quick_repeats[rank], self._last_restart[rank] = repeats, now
        return min(BACKOFF_START_S * 2**repeats, BACKOFF_MAX_S)

    def _give_back_state(self, rank: int) -> None:
        """What the dead process had been given: its policy server, on the same port (the gym agents know that
        URL), and the run's sampling seed."""
        group = self.weight_sync.generators  # the same hosts as self.generators.group, typed as generator workers
        if self.generators.http is not None:
            settings, urls = self.generators.http
            port = urlsplit(urls[rank]).port
            try:
                group.call(rank, GeneratorWorker.serve_http, settings, port)
            except WorkerDiedError:
                raise
            except WorkerCallError as error:
                raise RunEndingError(
                    f"generator rank {rank} was restarted but cannot serve gym agents on its port {port} again "
                    f"({error}); {RESUME_HINT}"
                ) from error
        if self.generators.seed is not None:
            group.call(rank, GeneratorWorker.reseed, self.generators.seed)

    def _catch_up(self) -> None:
        """Give the restarted ranks the published weights (the trainer is idle): a fresh sync group with every rank,
        the published version pushed to all and checksummed."""
        with self._condition:
            unsynced, version = set(self._unsynced), self._published
            self._reconnect = False
        try:
            self.weight_sync.reconnect()
            self.weight_sync.push(version, check=True)
        except (WeightSyncError, WorkerCallError) as error:
            self._after_sync_failure(error)
            return
        with self._condition:
            self._unsynced -= unsynced
            self._condition.notify_all()
        log.info("generator ranks %s hold weights version %d and serve again", sorted(unsynced), version)

    def _wait_until_built(self) -> tuple[set[int], bool]:
        """Wait until no rank awaits a restart; returns the ranks built without weights yet and whether the sync
        group must be opened afresh (which the caller then does). Raises the failure."""
        with self._condition:
            self._condition.wait_for(lambda: self._failure is not None or self._stopping or not self._down)
            if self._failure is not None:
                raise self._failure
            if self._stopping:
                raise RuntimeError("the run is ending: its generators are no longer restarted")
            reconnect, self._reconnect = self._reconnect, False
            return set(self._unsynced), reconnect
