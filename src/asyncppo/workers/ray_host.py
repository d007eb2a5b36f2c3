"""Thin Ray shells: one generic actor that hosts a plain worker object, and typed worker groups that fan a call out
to every rank and gather the results. A group's hosts start in the device slots reserved for them
(`reservations.py`); the ranks of a data-parallel group first join torch.distributed's default group, meeting at
rank 0's node IP, then build their workers. Starting or joining the cluster itself is `ray_cluster.py`.

    driver --WorkerGroup.call_all(PolicyWorker.train, batch)--> WorkerHost(rank 0) --> PolicyWorker.train(batch)
                                                           +--> WorkerHost(rank 1) --> PolicyWorker.train(batch)

A call names its method by the worker class's own function, so the type checker checks its arguments and
result; the host runs the method of that name on its worker (an override in a subclass wins). Only the facade
(`workers/groups.py`) and weight-sync wiring call into groups. Every worker class stays a plain class (usable
in-process, in tests); this module is the only place that knows they run in Ray actors. Calls wait with a
timeout and re-raise the worker's own error; a worker whose process died is a WorkerDiedError naming its role, rank
and process id, and a rank outside a data-parallel group can be started afresh in its slot (`WorkerGroup.replace`).

It stays one module past 400 lines because WorkerGroup (about 150 of them) is the one class that owns a group's
hosts: its calls, its death handling and `replace` read and write the same host list and pending calls, and a
split would pass that state between modules."""

import logging
import os
import re
import threading
import time

# Ray reads these at import: no usage reporting (no calls out of the machine) and every worker's log lines shown
# (not deduplicated across workers).
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
os.environ.setdefault("RAY_DEDUP_LOGS", "0")

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Concatenate, Generic, ParamSpec, TypeVar

import ray
from ray.exceptions import RayActorError, RayError, RayTaskError
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from asyncppo.distributed.default_group import Rendezvous, join_default_group
from asyncppo.pipeline.errors import RunEndingError
from asyncppo.workers.host_pool import DeviceSlot, HostOptions, keeping_hosts, take_idle_host

Worker = TypeVar("Worker", covariant=True)
Built = TypeVar("Built")
Params = ParamSpec("Params")
Result = TypeVar("Result")
RAYLET_WORKER_DIED = "A worker died or was killed"
"""How the raylet's report of a worker process that died mid-task starts (see `quiet_worker_death_reports`)."""
RESUME_HINT = "the run stops; rerun the same command to resume from its last checkpoint"

log = logging.getLogger(__name__)


class WorkerCallError(RuntimeError):
    """A call into a worker failed or timed out; the message names the group, rank and method."""


class WorkerDiedError(RunEndingError, WorkerCallError):
    """A worker's process died (killed, crashed): one line naming the role, the rank, the process id, the step (the
    driver adds it, `at_step`) and what Ray says of the exit. A generator's death is mended by a restart where
    generation.max_restarts allows; a trainer's ends the run."""

    def __init__(
        self, role: str, rank: int, pid: int | None, cause: str, step: int | None = None, outcome: str = RESUME_HINT
    ) -> None:
        self.role, self.rank, self.pid, self.cause, self.step, self.outcome = role, rank, pid, cause, step, outcome
        process = f", pid {pid}" if pid is not None else ""
        when = f" during step {step}" if step is not None else ""
        super().__init__(f"the {role} worker (rank {rank}{process}) died{when}: {cause}; {outcome}")

    def at_step(self, step: int) -> "WorkerDiedError":
        """This death, naming `step` (counted from 1) unless it names one already."""
        if self.step is not None:
            return self
        return WorkerDiedError(self.role, self.rank, self.pid, self.cause, step, self.outcome)


def death_cause(error: RayActorError) -> str:
    """What Ray's error says of a worker process's end, in a few words (its paragraph guesses at OOM killers)."""
    exit_type = re.search(r"Worker exit type: (\w+)", str(error))
    detail = f" (Ray exit type {exit_type.group(1)})" if exit_type else ""
    return f"its process ended unexpectedly{detail}"


def quiet_worker_death_reports() -> None:
    """Send the raylet's report of a worker process that died mid-task to the log (debug) instead of the console.

    Ray's driver prints it as a paragraph that guesses at OOM killers; the run names the dead worker in one line
    itself (WorkerDiedError), or restarts a dead generator and says so. Ray's listener of error reports looks up
    `print_to_stdstream` in its module at every report, so replacing that name changes what it prints; the worker
    log printer bound the function when Ray started and keeps it. Every other report is printed as before.
    """
    import ray._private.worker as ray_worker

    printer = ray_worker.print_to_stdstream
    if getattr(printer, "quiet_worker_deaths", False):
        return

    def print_unless_worker_death(data: dict[str, Any], ignore_prefix: bool) -> None:
        lines = [str(line) for line in data.get("lines", [])]
        if data.get("pid") == "raylet" and lines and all(line.startswith(RAYLET_WORKER_DIED) for line in lines):
            log.debug("raylet: %s", " ".join(lines))
            return
        printer(data, ignore_prefix)

    print_unless_worker_death.quiet_worker_deaths = True  # pyright: ignore[reportFunctionMemberAccess]  # a marker
    ray_worker.print_to_stdstream = print_unless_worker_death


def named_worker_error(where: str, error: BaseException) -> BaseException:
    """Ray's error of a call into `where` (`generator[1].generate`) as a WorkerCallError that names it; an error
    that did not come from Ray is returned as it is."""
    if isinstance(error, RayActorError):
        named = WorkerCallError(f"{where}: the worker process died: {death_cause(error)}")
    elif isinstance(error, RayTaskError):
        cause = error.cause if isinstance(error.cause, BaseException) else error
        named = WorkerCallError(f"{where} failed: {type(cause).__name__}: {cause}")
    elif isinstance(error, RayError):
        named = WorkerCallError(f"{where} failed: {type(error).__name__}: {error}")
    else:
        return error
    named.__cause__ = error
    return named


@dataclass(frozen=True)
class HostLocation:
    """Where a host process runs: its Ray node and that node's IP."""

    node_id: str
    node_ip: str


@ray.remote
class WorkerHost:
    """Hosts one plain worker object built in the actor process by `build`; `call` runs one of its methods."""

    def __init__(self, torch_threads: int | None = None):
        import random

        import torch

        if torch_threads is not None:
            torch.set_num_threads(torch_threads)
        self._target: Any = None
        # A fresh process's generator states, put back by `reset`: a kept host then draws what a new one would.
        self._fresh_random = (torch.get_rng_state(), random.getstate())

    def location(self) -> HostLocation:
        return HostLocation(ray.get_runtime_context().get_node_id(), ray.util.get_node_ip_address())

    def rendezvous_address(self) -> tuple[str, int]:
        """This node's IP and a port free on it right now: where a group whose rank 0 lives here can meet."""
        from asyncppo.distributed.process_group import free_port

        host = ray.util.get_node_ip_address()
        return host, free_port(host)

    def build(self, factory: Callable[[], Any], rank: int, rendezvous: Rendezvous | None) -> int:
        """Join the data-parallel group (when there is one), then build the worker: its model shards over the group.
        Returns this process's id (errors name it when the process dies)."""
        if rendezvous is not None:
            join_default_group(rendezvous, rank)
        self._target = factory()
        return os.getpid()

    def call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        """Run the worker's method `method` (a name taken from a typed `WorkerGroup` call)."""
        return getattr(self._target, method)(*args, **kwargs)

    def reset(self) -> None:
        """Back to a fresh host's state, for the next run of a driver that keeps its hosts (`host_pool.py`): the
        worker closed (engine threads, servers, weight-sync groups) and dropped, the data-parallel group destroyed,
        the random number generators as the process started."""
        import gc
        import random

        import torch
        import torch.distributed as dist

        target, self._target = self._target, None
        close = getattr(target, "close", None)
        if callable(close):
            close()
        del target, close
        gc.collect()
        if dist.is_initialized():
            dist.destroy_process_group()
        torch_state, python_state = self._fresh_random
        torch.set_rng_state(torch_state)
        random.setstate(python_state)


def start_host(options: HostOptions, slot: DeviceSlot | None = None) -> Any:
    """Start one WorkerHost actor, in `slot` of a placement group when given (returns its handle; its worker is
    built by `build`); a host an earlier run of this process kept there with the same options is taken instead
    (`host_pool.py`)."""
    if slot is not None and keeping_hosts() and (kept := take_idle_host(slot, options)) is not None:
        return kept
    strategy = None
    if slot is not None:
        strategy = PlacementGroupSchedulingStrategy(
            placement_group=slot.placement_group, placement_group_bundle_index=slot.bundle_index
        )
    return WorkerHost.options(  # pyright: ignore[reportAttributeAccessIssue]  # added by @ray.remote
        num_cpus=options.num_cpus,
        num_gpus=options.num_gpus,
        max_concurrency=options.max_concurrency,
        scheduling_strategy=strategy,
    ).remote(options.torch_threads)


@dataclass(frozen=True)
class PendingCall(Generic[Result]):
    """A call started on one rank: wait for its result with `WorkerGroup.gather`."""

    ref: Any
    """The Ray ObjectRef of the result."""
    rank: int
    method: str


class WorkerGroup(Generic[Worker]):
    """The ranks of one role (policy, value, generator): hosts of `Worker` objects behind typed calls.

    `method` arguments are functions of the worker class (`PolicyWorker.train`), so the arguments after it and
    the result are checked against that method's signature.
    """

    def __init__(self, name: str, hosts: Sequence[Any], timeout_s: float, options: HostOptions | None = None):
        self.name = name
        self.hosts = list(hosts)
        self.timeout_s = timeout_s
        self.options = options if options is not None else HostOptions()
        self.slots: list[DeviceSlot | None] = [None] * len(self.hosts)
        """The slot each host was started in (None: outside any placement group), in rank order."""
        self.pids: list[int | None] = [None] * len(self.hosts)
        """Each host's process id once its worker is built (None before), in rank order."""
        self.factories: list[Callable[[], Any]] = []
        """Each rank's worker factory (`launch`'s), for `replace`."""

    # A static method with its own type variable: pyright infers the worker type from the factories only here
    # (through a classmethod on the unparameterized `WorkerGroup` it stays Unknown).
    @staticmethod
    def launch(
        name: str,
        factories: Sequence[Callable[[], Built]],
        options: HostOptions,
        timeout_s: float,
        slots: Sequence[DeviceSlot] | None = None,
        data_parallel: str | None = None,
    ) -> "StartingGroup[Built]":
        """Start one host per factory (in `slots[rank]` when given) and send each its build, without waiting for
        them: `wait_until_built` waits. Several groups launched before one wait build at the same
        time (a run's start-up is mostly imports and model loading in each worker process, which need not take
        turns).

        data_parallel: a torch.distributed backend (`gloo`, `nccl`): with more than one factory the hosts first
        form one default process group, meeting at rank 0's node, so the workers shard their models over it.
        """
        if slots is not None and len(slots) != len(factories):
            raise ValueError(f"{name}: {len(factories)} workers but {len(slots)} placement slots")
        group = WorkerGroup[Built](name, [], timeout_s, options)
        group.factories = list(factories)
        try:
            # Appended one by one so a failure part-way ends the hosts already started.
            for rank in range(len(factories)):
                slot = None if slots is None else slots[rank]
                group.hosts.append(start_host(options, slot))
                group.slots.append(slot)
                group.pids.append(None)
            rendezvous = None
            if data_parallel is not None and len(factories) > 1:
                host, port = group.rendezvous_address(0)
                rendezvous = Rendezvous(host, port, len(factories), data_parallel, timeout_s)
            # Every rank builds at once: the group's rendezvous waits for all of them.
            builds = [
                PendingCall(host.build.remote(factory, rank, rendezvous), rank, "build")
                for rank, (host, factory) in enumerate(zip(group.hosts, factories, strict=True))
            ]
        except BaseException:
            group.kill()
            raise
        return StartingGroup(group, builds)

    """`launch`, then wait until every host has built its worker; takes `launch`'s arguments and returns the group."""

    def rendezvous_address(self, rank: int) -> tuple[str, int]:
        """`rank`'s node IP and a port free there: where a group whose rank 0 is that host can meet."""
        return self.gather([PendingCall(self.hosts[rank].rendezvous_address.remote(), rank, "rendezvous_address")])[0]

    def locations(self) -> list[HostLocation]:
        """Where each rank's host runs, in rank order."""
        return self.gather(
            [PendingCall(host.location.remote(), rank, "location") for rank, host in enumerate(self.hosts)]
        )

    def __len__(self) -> int:
        return len(self.hosts)

    def submit(
        self,
        rank: int,
        method: Callable[Concatenate[Worker, Params], Result],
        *args: Params.args,
        **kwargs: Params.kwargs,
    ) -> PendingCall[Result]:
        """Start `method` on one rank; wait for it with `gather`."""
        name = method.__name__
        return PendingCall(self.hosts[rank].call.remote(name, *args, **kwargs), rank, name)

    def submit_all(
        self, method: Callable[Concatenate[Worker, Params], Result], *args: Params.args, **kwargs: Params.kwargs
    ) -> list[PendingCall[Result]]:
        """Start `method` with the same arguments on every rank."""
        return [self.submit(rank, method, *args, **kwargs) for rank in range(len(self.hosts))]

    def gather(self, calls: Sequence[PendingCall[Result]], timeout_s: float | None = None) -> list[Result]:
        """The results of `calls` in their order. Waits for them in the order they finish, so the first failure is
        raised at once, naming the group, rank and method, even while other ranks still wait for it in a
        collective; past the timeout the error names the first call still running."""
        timeout = self.timeout_s if timeout_s is None else timeout_s
        return gather_named([(self, call) for call in calls], timeout)

    def where(self, call: PendingCall[Any]) -> str:
        """The call as errors name it: `group[rank].method`."""
        return f"{self.name}[{call.rank}].{call.method}"

    def call_all(
        self, method: Callable[Concatenate[Worker, Params], Result], *args: Params.args, **kwargs: Params.kwargs
    ) -> list[Result]:
        """Run `method` on every rank and return the results in rank order."""
        return self.gather(self.submit_all(method, *args, **kwargs))

    def call(
        self,
        rank: int,
        method: Callable[Concatenate[Worker, Params], Result],
        *args: Params.args,
        **kwargs: Params.kwargs,
    ) -> Result:
        """Run `method` on one rank."""
        return self.gather([self.submit(rank, method, *args, **kwargs)])[0]

    def died(self, rank: int, error: RayActorError) -> WorkerDiedError:
        """The death of `rank`'s process, as Ray reported it, named by role, rank and process id."""
        return WorkerDiedError(self.name, rank, self.pids[rank], death_cause(error))

    def replace(self, rank: int, timeout_s: float) -> None:
        """Start a fresh host for `rank` in the slot of the one it replaces (which died), build its worker from the
        same factory (without a data-parallel group: for generators), then route the rank's calls to it. The old
        host is ended first in case it lingers; a new one that fails to build is ended too and the error raised (a
        WorkerDiedError naming its start when its process died as well)."""
        ray.kill(self.hosts[rank])  # a dead host's kill is a no-op
        host = start_host(self.options, self.slots[rank])
        build = PendingCall(host.build.remote(self.factories[rank], rank, None), rank, "build")
        try:
            (pid,) = ray.get([build.ref], timeout=timeout_s)
        except RayActorError as error:
            raise WorkerDiedError(self.name, rank, None, f"{death_cause(error)} while it was starting") from error
        except (RayError, TimeoutError) as error:
            ray.kill(host)
            raise named_worker_error(f"{self.where(build)} (a restart)", error) from error
        self.hosts[rank] = host
        self.pids[rank] = pid

    def kill(self) -> None:
        """End every host process of the group."""
        for host in self.hosts:
            ray.kill(host)


@dataclass(frozen=True)
class StartingGroup(Generic[Built]):
    """A group whose hosts are started and whose builds are running (`WorkerGroup.launch`)."""

    group: WorkerGroup[Built]
    builds: list[PendingCall[None]]


def wait_until_built(starting: Sequence[StartingGroup[Any]]) -> None:
    """Wait for the builds of every group in `starting`, which run at the same time; the first failure is raised at
    once, naming its group and rank, and past the longest of the groups' timeouts the error names a build still
    running. The caller ends the groups on failure."""
    timeout = max((one.group.timeout_s for one in starting), default=0.0)
    calls = [(one.group, call) for one in starting for call in one.builds]
    for (group, call), pid in zip(calls, gather_named(calls, timeout), strict=True):
        group.pids[call.rank] = pid


def gather_named(calls: Sequence[tuple[WorkerGroup[Any], PendingCall[Any]]], timeout_s: float) -> list[Any]:
    """The results of calls into one or more groups, in the order given; waits for them in the order they finish so
    the first failure is raised at once, as a WorkerCallError naming `group[rank].method` (a WorkerDiedError when
    the rank's process died)."""
    deadline = time.monotonic() + timeout_s
    pending = {call.ref: (group, call) for group, call in calls}
    results: dict[Any, Any] = {}
    try:
        while pending:
            done, _ = ray.wait(list(pending), num_returns=1, timeout=max(deadline - time.monotonic(), 0.0))
            if not done:
                group, first = next(iter(pending.values()))
                raise WorkerCallError(f"{group.where(first)} did not finish within {timeout_s:.0f} s")
            for ref in done:
                group, call = pending.pop(ref)
                try:
                    results[ref] = ray.get(ref)
                except RayActorError as error:
                    raise group.died(call.rank, error) from error
                except RayError as error:
                    raise named_worker_error(group.where(call), error) from error
    finally:
        abandon(list(pending))  # left running by a failure raised above
    return [results[call.ref] for _, call in calls]


def abandon(refs: Sequence[Any]) -> None:
    """Let calls whose results nobody will read finish in the background: they are read there as they end, their
    errors logged at debug level. (A failed call that is never read makes Ray print its traceback when the ref
    is dropped; these are calls left behind by a failure already raised, such as the rest of a broken push.)"""
    if refs:
        _abandoned.add(refs)


class _AbandonedCalls:
    """The background reader of abandoned calls: one daemon thread, started by the first abandoned call."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._refs: list[Any] = []
        self._thread: threading.Thread | None = None

    def add(self, refs: Sequence[Any]) -> None:
        with self._lock:
            self._refs.extend(refs)
            if self._thread is None:
                self._thread = threading.Thread(target=self._read, name="abandoned-ray-calls", daemon=True)
                self._thread.start()

    def _read(self) -> None:
        while True:
            with self._lock:
                refs, self._refs = self._refs, []
                if not refs:
                    self._thread = None
                    return
            try:
                done, left = ray.wait(refs, num_returns=len(refs), timeout=1.0)
            except RayError:  # Ray shut down meanwhile: nothing is left to read
                with self._lock:
                    self._refs, self._thread = [], None
                return
            for ref in done:
                try:
                    ray.get(ref)
                except RayError as error:  # the failure this call shared was raised where it was found
                    log.debug("an abandoned worker call failed: %s", type(error).__name__)
            with self._lock:
                self._refs.extend(left)


_abandoned = _AbandonedCalls()
