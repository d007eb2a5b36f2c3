"""Thin Ray shells: a local cluster bound to 127.0.0.1, one generic actor that hosts a plain worker object,
and worker groups that fan a call out to every rank and gather the results.

    driver --WorkerGroup.call("train", batch)--> WorkerHost(rank 0) --> PolicyWorker.train(batch)
                                             +--> WorkerHost(rank 1) --> PolicyWorker.train(batch)

Every worker class stays a plain class (usable in-process, in tests); this module is the only place that
knows they run in Ray actors. Calls wait with a timeout and re-raise the worker's own error.
"""

import os

# Ray reads these at import: no usage reporting (no calls out of the machine), every worker's log lines shown
# (not deduplicated across workers), and no multi-node cluster on Windows or macOS hosts.
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
os.environ.setdefault("RAY_DEDUP_LOGS", "0")

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import ray
from ray.exceptions import GetTimeoutError, RayActorError, RayTaskError

LOCAL_HOST = "127.0.0.1"
OBJECT_STORE_BYTES = 256 * 1024 * 1024


class WorkerCallError(RuntimeError):
    """A call into a worker failed or timed out; the message names the group, rank and method."""


def init_local_ray(num_cpus: int | None, num_gpus: int | None = None, address: str | None = None) -> None:
    """Start (or join) Ray. A local cluster binds to 127.0.0.1 only and starts no dashboard."""
    if ray.is_initialized():
        return
    if address is not None:
        ray.init(address=address, log_to_driver=True)
        return
    ray.init(
        num_cpus=num_cpus,
        num_gpus=num_gpus,
        include_dashboard=False,
        object_store_memory=OBJECT_STORE_BYTES,
        _node_ip_address=LOCAL_HOST,
        log_to_driver=True,
        configure_logging=False,
    )


@ray.remote
class WorkerHost:
    """Hosts one plain worker object built in the actor process by `factory`; `call` runs one of its methods."""

    def __init__(self, factory: Callable[[], Any], torch_threads: int | None = None):
        if torch_threads is not None:
            import torch

            torch.set_num_threads(torch_threads)
        self._target = factory()

    def call(self, method: str, *args: Any, **kwargs: Any) -> Any:
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


class WorkerGroup:
    """Ranks of one kind of worker (policy, value, generator) behind one call interface."""

    def __init__(self, name: str, hosts: Sequence[Any], timeout_s: float):
        self.name = name
        self.hosts = list(hosts)
        self.timeout_s = timeout_s

    @classmethod
    def start(
        cls, name: str, factories: Sequence[Callable[[], Any]], options: HostOptions, timeout_s: float
    ) -> "WorkerGroup":
        """Start one host per factory and wait until every one has built its worker."""
        group = cls(
            name, [start_host(factory, options, f"{name}-{rank}") for rank, factory in enumerate(factories)], timeout_s
        )
        group.gather([host.ready.remote() for host in group.hosts], "ready")
        return group

    def __len__(self) -> int:
        return len(self.hosts)

    def submit(self, rank: int, method: str, *args: Any, **kwargs: Any) -> Any:
        """Start `method` on one rank; returns the ObjectRef (wait on it with `gather`)."""
        return self.hosts[rank].call.remote(method, *args, **kwargs)

    def submit_all(self, method: str, *args: Any, **kwargs: Any) -> list[Any]:
        """Start `method` with the same arguments on every rank."""
        return [self.submit(rank, method, *args, **kwargs) for rank in range(len(self.hosts))]

    def gather(
        self, refs: Sequence[Any], method: str, timeout_s: float | None = None, ranks: Sequence[int] | None = None
    ) -> list[Any]:
        """Wait for refs (of `ranks`, default 0..n-1); a failure or timeout names the group, rank and method."""
        timeout = self.timeout_s if timeout_s is None else timeout_s
        results = []
        for rank, ref in zip(range(len(refs)) if ranks is None else ranks, refs, strict=True):
            try:
                results.append(ray.get(ref, timeout=timeout))
            except GetTimeoutError:
                raise WorkerCallError(f"{self.name}[{rank}].{method} did not finish within {timeout:.0f} s") from None
            except RayTaskError as error:
                cause = error.cause if isinstance(error.cause, BaseException) else error
                raise WorkerCallError(
                    f"{self.name}[{rank}].{method} failed: {type(cause).__name__}: {cause}"
                ) from error
            except RayActorError as error:
                raise WorkerCallError(f"{self.name}[{rank}].{method}: the worker process died ({error})") from error
        return results

    def call_all(self, method: str, *args: Any, **kwargs: Any) -> list[Any]:
        """Run `method` on every rank and return the results in rank order."""
        return self.gather(self.submit_all(method, *args, **kwargs), method)

    def call(self, rank: int, method: str, *args: Any, **kwargs: Any) -> Any:
        """Run `method` on one rank."""
        return self.gather([self.submit(rank, method, *args, **kwargs)], method, ranks=[rank])[0]

    def kill(self) -> None:
        """End every host process of the group."""
        for host in self.hosts:
            ray.kill(host)
