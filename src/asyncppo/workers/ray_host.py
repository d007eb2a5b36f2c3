"""Thin Ray shells: a local cluster bound to 127.0.0.1, one generic actor that hosts a plain worker object,
and typed worker groups that fan a call out to every rank and gather the results.

    driver --WorkerGroup.call_all(PolicyWorker.train, batch)--> WorkerHost(rank 0) --> PolicyWorker.train(batch)
                                                           +--> WorkerHost(rank 1) --> PolicyWorker.train(batch)

A call names its method by the worker class's own function, so the type checker checks its arguments and
result; the host runs the method of that name on its worker (an override in a subclass wins). Only the facade
(`workers/groups.py`) and weight-sync wiring call into groups. Every worker class stays a plain class (usable
in-process, in tests); this module is the only place that knows they run in Ray actors. Calls wait with a
timeout and re-raise the worker's own error.
"""

import os
import signal
import threading

# Ray reads these at import: no usage reporting (no calls out of the machine), every worker's log lines shown
# (not deduplicated across workers), and no multi-node cluster on Windows or macOS hosts.
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
os.environ.setdefault("RAY_DEDUP_LOGS", "0")

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Concatenate, Generic, ParamSpec, TypeVar

import ray
from ray.exceptions import GetTimeoutError, RayActorError, RayTaskError

LOCAL_HOST = "127.0.0.1"
OBJECT_STORE_BYTES = 256 * 1024 * 1024
Worker = TypeVar("Worker", covariant=True)
Built = TypeVar("Built")
Params = ParamSpec("Params")
Result = TypeVar("Result")


class WorkerCallError(RuntimeError):
    """A call into a worker failed or timed out; the message names the group, rank and method."""


def init_local_ray(num_cpus: int | None, num_gpus: int | None = None, address: str | None = None) -> None:
    """Start (or join) Ray. A local cluster binds to 127.0.0.1 only and starts no dashboard.

    A SIGTERM or SIGINT handler the process installed before is put back afterwards: `ray.init` replaces the
    driver's SIGTERM handler with its own (one that tears the local cluster down and exits with status 1), which
    would skip the caller's clean stop (`asyncppo train` saves a checkpoint first).
    """
    if ray.is_initialized():
        return
    own_handlers = _own_signal_handlers()
    if address is not None:
        ray.init(address=address, log_to_driver=True)
    else:
        ray.init(
            num_cpus=num_cpus,
            num_gpus=num_gpus,
            include_dashboard=False,
            object_store_memory=OBJECT_STORE_BYTES,
            _node_ip_address=LOCAL_HOST,
            log_to_driver=True,
            configure_logging=False,
        )
    for signum, handler in own_handlers.items():
        signal.signal(signum, handler)


def _own_signal_handlers() -> dict[int, Any]:
    """The SIGTERM / SIGINT handlers the process installed (Python's defaults excluded), by signal number."""
    if threading.current_thread() is not threading.main_thread():
        return {}  # only the main thread may set handlers, and Ray sets none from another thread
    handlers = {signum: signal.getsignal(signum) for signum in (signal.SIGTERM, signal.SIGINT)}
    return {
        signum: handler
        for signum, handler in handlers.items()
        if callable(handler) and handler is not signal.default_int_handler
    }


def shutdown_ray() -> None:
    """Disconnect from Ray; a local cluster that `init_local_ray` started ends with every process it ran."""
    if ray.is_initialized():
        ray.shutdown()


@ray.remote
class WorkerHost:
    """Hosts one plain worker object built in the actor process by `factory`; `call` runs one of its methods."""

    def __init__(self, factory: Callable[[], Any], torch_threads: int | None = None):
        if torch_threads is not None:
            import torch

            torch.set_num_threads(torch_threads)
        self._target = factory()

    def call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        """Run the worker's method `method` (a name taken from a typed `WorkerGroup` call)."""
        return getattr(self._target, method)(*args, **kwargs)

    def ready(self) -> bool:
        return True


@dataclass(frozen=True)
class HostOptions:
    """Ray resources of one host actor."""

    num_cpus: float = 1.0
    num_gpus: float = 0.0
    max_concurrency: int = 1
    """Above 1 the actor runs calls in threads (generators batch concurrent requests)."""
    torch_threads: int | None = None


def start_host(factory: Callable[[], Any], options: HostOptions, name: str) -> Any:
    """Start one WorkerHost actor (returns its handle; it is ready once `ready` returns)."""
    return WorkerHost.options(  # pyright: ignore[reportAttributeAccessIssue]  # added by @ray.remote
        num_cpus=options.num_cpus,
        num_gpus=options.num_gpus,
        max_concurrency=options.max_concurrency,
        name=None,
    ).remote(factory, options.torch_threads)


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

    def __init__(self, name: str, hosts: Sequence[Any], timeout_s: float):
        self.name = name
        self.hosts = list(hosts)
        self.timeout_s = timeout_s

    # A static method with its own type variable: pyright infers the worker type from the factories only here
    # (through a classmethod on the unparameterized `WorkerGroup` it stays Unknown).
    @staticmethod
    def start(
        name: str, factories: Sequence[Callable[[], Built]], options: HostOptions, timeout_s: float
    ) -> "WorkerGroup[Built]":
        """Start one host per factory and wait until every one has built its worker."""
        group = WorkerGroup[Built](
            name, [start_host(factory, options, f"{name}-{rank}") for rank, factory in enumerate(factories)], timeout_s
        )
        group.gather([PendingCall(host.ready.remote(), rank, "ready") for rank, host in enumerate(group.hosts)])
        return group

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
        """Wait for `calls` in order; a failure or timeout names the group, rank and method."""
        timeout = self.timeout_s if timeout_s is None else timeout_s
        results: list[Result] = []
        for call in calls:
            where = f"{self.name}[{call.rank}].{call.method}"
            try:
                results.append(ray.get(call.ref, timeout=timeout))
            except GetTimeoutError:
                raise WorkerCallError(f"{where} did not finish within {timeout:.0f} s") from None
            except RayTaskError as error:
                cause = error.cause if isinstance(error.cause, BaseException) else error
                raise WorkerCallError(f"{where} failed: {type(cause).__name__}: {cause}") from error
            except RayActorError as error:
                raise WorkerCallError(f"{where}: the worker process died ({error})") from error
        return results

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

    def kill(self) -> None:
        """End every host process of the group."""
        for host in self.hosts:
            ray.kill(host)
