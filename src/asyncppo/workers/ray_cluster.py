"""The Ray cluster a run uses: a local one bound to 127.0.0.1 (no dashboard, a small object store), or an existing
cluster joined, with the process's own SIGTERM / SIGINT handlers kept in charge while Ray starts; and its shutdown.

    init_local_ray --address None--> a new local cluster on loopback (keep_ray_on_loopback first)
                   --address given--> join it (looked for on loopback when the address is a loopback one)
    signals during ray.init --> held, then handed to the caller's handler once Ray is up
"""

import contextlib
import os
import signal
import threading

# Ray reads these at import: no usage reporting (no calls out of the machine) and every worker's log lines shown
# (not deduplicated across workers).
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
os.environ.setdefault("RAY_DEDUP_LOGS", "0")

from collections.abc import Callable, Generator
from types import FrameType
from typing import Any

import ray
import ray._private.ray_constants as ray_constants
import ray._private.utils as ray_utils

from asyncppo.distributed.process_group import is_loopback

LOCAL_HOST = "127.0.0.1"
# Ray's switch between a machine-local cluster (every daemon and worker on 127.0.0.1) and one other machines may
# join (the node's network IP, listening on all interfaces). Ray reads it when it is imported, in the driver and
# in every worker process it starts.
LOCAL_ONLY_ENV = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"
OBJECT_STORE_BYTES = 256 * 1024 * 1024


def init_local_ray(num_cpus: int | None, num_gpus: int | None = None, address: str | None = None) -> None:
    """Start (or join) Ray. A local cluster binds to 127.0.0.1 only and starts no dashboard; a cluster joined at a
    loopback address (`ray start --head --node-ip-address 127.0.0.1`) is looked for there, any other address as Ray
    does.

    A SIGTERM or SIGINT handler the process installed before stays in charge, but only once Ray has started: while
    `ray.init` runs, the two signals are held and handed to that handler when it returns. Ray would otherwise replace
    the driver's SIGTERM handler with its own twice (one that exits with status 15, then one that tears the local
    cluster down and exits with status 1), skipping the caller's clean stop; and a start cut short half-way leaves
    daemons (Ray's agents) that no shutdown finds, while a started cluster ends with `shutdown_ray`.
    """
    if ray.is_initialized():
        return
    own_handlers = _own_signal_handlers()
    if address is None or _is_loopback_address(address):
        keep_ray_on_loopback()
    with _signals_held_for(own_handlers):
        if address is not None:
            ray.init(address=address, log_to_driver=True)
        else:
            ray.init(
                # "local": always a new cluster of this run's own. Without it Ray joins any cluster that `ray start`
                # left on this machine, and then refuses the sizes below.
                address="local",
                num_cpus=num_cpus,
                num_gpus=num_gpus,
                include_dashboard=False,
                object_store_memory=OBJECT_STORE_BYTES,
                _node_ip_address=LOCAL_HOST,
                log_to_driver=True,
                configure_logging=False,
            )
    node_ip = ray.util.get_node_ip_address()
    if address is None and not is_loopback(node_ip):
        ray.shutdown()
        raise RuntimeError(
            f"the local Ray cluster came up on {node_ip}, not on {LOCAL_HOST}; nothing may listen beyond loopback"
        )


def _is_loopback_address(address: str) -> bool:
    """Whether a cluster address (`host:port`) names this machine's loopback: a cluster started there with
    `ray start --node-ip-address 127.0.0.1`, which Ray would otherwise look for at the machine's network IP."""
    host = address.rsplit(":", 1)[0].strip("[]")
    return is_loopback(host)


def keep_ray_on_loopback() -> None:
    """Make the cluster about to start local to this machine, whenever Ray was imported.

    Ray turns `_node_ip_address=127.0.0.1` into the machine's network IP (and its daemons and workers then listen on
    all interfaces) unless its local-only switch is on. The switch is read once, when `ray` is imported: the
    environment variable covers the worker processes the cluster starts, and the driver's copy, read when `ray`
    was imported (perhaps before this module), is set here too.
    """
    os.environ[LOCAL_ONLY_ENV] = "0"
    ray_constants.ENABLE_RAY_CLUSTER = False


@contextlib.contextmanager
def _signals_held_for(handlers: dict[int, Any]) -> Generator[None]:
    """While the block runs, the signals of `handlers` are only recorded (and Ray's helper that installs its SIGTERM
    handlers does nothing); afterwards `handlers` are in place and each signal recorded is raised again for them."""
    if not handlers:
        yield
        return
    held: list[int] = []

    def hold(signum: int, _: FrameType | None) -> None:
        held.append(signum)

    for signum in handlers:
        signal.signal(signum, hold)
    installer = ray_utils.set_sigterm_handler
    ray_utils.set_sigterm_handler = _leave_sigterm_handler
    try:
        yield
    finally:
        ray_utils.set_sigterm_handler = installer
        for signum, handler in handlers.items():
            signal.signal(signum, handler)
        for signum in held:
            signal.raise_signal(signum)  # the handler runs now (an exception it raises ends the caller's start)


def _leave_sigterm_handler(handler: Callable[[int, FrameType | None], Any]) -> None:
    """Stands in for Ray's `set_sigterm_handler` while signals are held: the handler is not installed."""


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
    """Disconnect from Ray; a local cluster that `init_local_ray` started ends with every process it ran, also one
    whose start a signal interrupted (Ray is then not initialized, but its daemons may run)."""
    ray.shutdown()  # a no-op when nothing was started
