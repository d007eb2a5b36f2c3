"""The weight-sync process group: trainer rank 0 plus every generator rank, opened from its own TCPStore.

The driver picks a host and port and hands the same `SyncGroupSpec` to every participant; each calls
`open_sync_group(spec, rank)`. The group never touches torch's default process group, so the trainer keeps its
own training group beside it. `weight_sync.py` runs its broadcasts through `SyncGroup`.

    trainer, rank 0 --hosts--> TCPStore(host:port) <--joins-- generators, ranks 1..N
          |                        | PrefixStore("asyncppo/weight_sync")
          +-------- gloo (CPU) | nccl (CUDA) backend object, every wait bounded by timeout_s --------+

The store is unauthenticated, so rank 0 listens on `host` only (127.0.0.1 locally), never on every interface.
"""

import datetime
import ipaddress
import socket
import time
from dataclasses import dataclass
from typing import Literal, Protocol, cast

import torch

# The ignore is for PrefixStore and TCPStore: public torch.distributed names that torch's stubs declare only in
# the private extension module.
from torch.distributed import AllreduceOptions, BroadcastOptions, PrefixStore, ProcessGroupGloo, TCPStore, Work  # pyright: ignore[reportPrivateImportUsage]

SyncBackend = Literal["gloo", "nccl"]
_STORE_PREFIX = "asyncppo/weight_sync"
_JOIN_POLL_S = 0.02
# Pending connections the store's socket queues: every generator rank connects at once, and each opens several.
_LISTEN_BACKLOG = 128


class WeightSyncError(RuntimeError):
    """A weight transfer failed or timed out; the group is unusable afterwards (close it, fail or rebuild)."""


@dataclass(frozen=True)
class SyncGroupSpec:
    """Where and how the sync group meets; the driver builds one and hands it to every participant."""

    host: str
    """Address of rank 0 (the trainer), which hosts the TCPStore and listens on this address only; 127.0.0.1 when
    everything is local."""
    port: int
    """A free TCP port on `host`, chosen by the driver (`free_port`)."""
    world_size: int
    """1 trainer rank + the number of generator ranks."""
    backend: SyncBackend
    """`gloo` (CPU buckets) or `nccl` (buckets on each rank's CUDA device; one GPU per rank)."""
    timeout_s: float
    """Bound on joining the group and on every collective; past it the call raises `WeightSyncError`."""

    def __post_init__(self) -> None:
        if self.world_size < 2:
            raise ValueError(f"world_size={self.world_size}: a sync group needs rank 0 and at least one generator")
        if not 0 < self.port < 65536:
            raise ValueError(f"port={self.port} must be in 1..65535")
        if self.backend not in ("gloo", "nccl"):
            raise ValueError(f"backend={self.backend!r}: expected 'gloo' or 'nccl'")
        if self.timeout_s <= 0:
            raise ValueError(f"timeout_s={self.timeout_s} must be > 0")


def free_port(host: str = "127.0.0.1") -> int:
    """A port that is free right now on `host` (another process may take it before the store binds it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind((host, 0))
        return probe.getsockname()[1]


class _Collectives(Protocol):
    """What the group uses of a c10d backend object (ProcessGroupGloo or ProcessGroupNCCL).

    These backend objects, built directly rather than through `init_process_group`, are the documented way to get
    a group outside the default world; torch's stubs leave their collectives out, hence this protocol.
    """

    def broadcast(self, tensors: list[torch.Tensor], opts: BroadcastOptions, /) -> Work: ...
    def allreduce(self, tensors: list[torch.Tensor], opts: AllreduceOptions, /) -> Work: ...
    def shutdown(self) -> None: ...
    def abort(self) -> None: ...


class PendingCollective:
    """One collective in flight; `wait` bounds it by the group timeout and keeps its tensor alive until then."""

    def __init__(self, group: "SyncGroup", work: Work, tensor: torch.Tensor, what: str) -> None:
        self._group, self._work, self.tensor, self.what = group, work, tensor, what
        self._started = time.monotonic()

    def wait(self) -> torch.Tensor:
        timeout_s = self._group.spec.timeout_s
        try:
            self._work.wait(datetime.timedelta(seconds=timeout_s))
        except RuntimeError as error:  # gloo and nccl report timeouts and dead peers as RuntimeError
            self._group.broken = True
            elapsed = time.monotonic() - self._started
            raise WeightSyncError(
                f"weight sync rank {self._group.rank} of {self._group.world_size}: {self.what} failed after "
                f"{elapsed:.1f} s (timeout {timeout_s:g} s): {_first_line(error)}"
            ) from error
        return self.tensor


class SyncGroup:
    """An open sync group; collectives block at most `spec.timeout_s` and raise `WeightSyncError` past it."""

    def __init__(self, spec: SyncGroupSpec, rank: int, store: TCPStore, backend: _Collectives, device: torch.device):
        self.spec, self.rank, self.device = spec, rank, device
        self.world_size = spec.world_size
        self.broken = False
        # The store must outlive the backend: rank 0 hosts it, and NCCL reads it when communicators are created.
        self._store: TCPStore | None = store
        self._backend: _Collectives | None = backend

    def broadcast_async(self, tensor: torch.Tensor, src: int = 0, what: str = "tensor") -> PendingCollective:
        """Start broadcasting `tensor` (on `self.device`) from rank `src`; receivers' tensors are overwritten."""
        options = BroadcastOptions()
        options.rootRank = src
        options.rootTensor = 0
        return PendingCollective(self, self._live_backend(what).broadcast([tensor], options), tensor, what)

    def broadcast(self, tensor: torch.Tensor, src: int = 0, what: str = "tensor") -> None:
        """Broadcast and wait; `what` names the payload in errors, e.g. "bucket 3/7 of version 12"."""
        self.broadcast_async(tensor, src, what).wait()

    def all_reduce_sum(self, tensor: torch.Tensor, what: str) -> None:
        """In-place sum over all ranks; used as the end-of-transfer receipt."""
        options = AllreduceOptions()  # reduceOp defaults to SUM
        PendingCollective(self, self._live_backend(what).allreduce([tensor], options), tensor, what).wait()

    def close(self) -> None:
        """Release the backend and the store; safe to call twice. A broken NCCL group is aborted, not drained."""
        backend, self._backend, self._store = self._backend, None, None
        if backend is not None and self.broken and self.spec.backend == "nccl":
            backend.abort()  # a drained shutdown would wait on the collective that already failed
        elif backend is not None:
            backend.shutdown()

    def __enter__(self) -> "SyncGroup":
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _live_backend(self, what: str) -> _Collectives:
        if self._backend is None:
            raise WeightSyncError(f"weight sync rank {self.rank}: {what} on a closed group")
        if self.broken:
            raise WeightSyncError(f"weight sync rank {self.rank}: {what} on a group broken by an earlier failure")
        return self._backend


def open_sync_group(spec: SyncGroupSpec, rank: int, device: torch.device | None = None) -> SyncGroup:
    """Join the group as `rank`: rank 0 hosts the store; all ranks wait (at most `spec.timeout_s`) for each other.

    `device` is where buckets live: CPU for gloo; for nccl this rank's GPU (default: the current CUDA device).
    """
    if not 0 <= rank < spec.world_size:
        raise ValueError(f"rank={rank} must be in 0..{spec.world_size - 1}")
    if spec.backend == "gloo":
        device = torch.device("cpu")
    elif device is None or device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    deadline = time.monotonic() + spec.timeout_s
    timeout = datetime.timedelta(seconds=spec.timeout_s)
    store = _connect_store(spec, rank, deadline)
    _rendezvous(PrefixStore(_STORE_PREFIX, store), spec, rank, deadline, _device_label(device))
    group_store = PrefixStore(f"{_STORE_PREFIX}/backend", store)
    if spec.backend == "gloo":
        backend = _gloo_backend(group_store, spec, rank, timeout)
    else:
        backend = _nccl_backend(group_store, spec, rank, timeout, device)
    group = SyncGroup(spec, rank, store, backend, device)
    # A first tiny collective proves every pair is connected before any weights move.
    group.broadcast(torch.zeros(1, dtype=torch.int64, device=device), what="the group warm-up")
    return group


def _connect_store(spec: SyncGroupSpec, rank: int, deadline: float) -> TCPStore:
    try:
        return open_store(spec.host, spec.port, rank, deadline)
    except (RuntimeError, OSError) as error:  # DistStoreError is a RuntimeError; timeouts are OSError
        where = f"{spec.host}:{spec.port}"
        role = "host the sync store on" if rank == 0 else "reach the sync store of rank 0 at"
        message = f"weight sync rank {rank} could not {role} {where} within {spec.timeout_s:g} s: {_first_line(error)}"
        raise WeightSyncError(message) from error


def open_store(host: str, port: int, rank: int, deadline: float) -> TCPStore:
    """Rank 0 hosts a TCPStore listening on `host`:`port` only; the other ranks connect to it by `deadline`
    (time.monotonic()). Raises RuntimeError or OSError (a timeout) when that fails."""
    if rank != 0:
        # torch's client retries with a back-off that can overshoot its timeout by ~1.5x; wait for the port
        # here against our own deadline, so the store connects at once.
        _wait_for_listener(host, port, deadline)
    timeout = datetime.timedelta(seconds=max(deadline - time.monotonic(), 0.1))
    # wait_for_workers=False: callers wait for their ranks themselves, so they can say which ones are missing.
    if rank != 0:
        return TCPStore(host, port, None, False, timeout, wait_for_workers=False)
    listen_fd = _listening_socket(host, port).detach()  # the store owns (and closes) the fd
    return TCPStore(host, port, None, True, timeout, wait_for_workers=False, master_listen_fd=listen_fd)


def _listening_socket(host: str, port: int) -> socket.socket:
    """A socket listening on `host`:`port` only: torch's store server, left to itself, binds every interface."""
    family, kind, protocol, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
    listener = socket.socket(family, kind, protocol)
    try:
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(address)
        listener.listen(_LISTEN_BACKLOG)
    except OSError:
        listener.close()
        raise
    return listener


def _wait_for_listener(host: str, port: int, deadline: float) -> None:
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise TimeoutError("nothing listens there yet")
        try:
            with socket.create_connection((host, port), timeout=min(remaining, 1.0)):
                return
        except OSError:
            time.sleep(min(_JOIN_POLL_S, max(deadline - time.monotonic(), 0.0)))


def _rendezvous(store: PrefixStore, spec: SyncGroupSpec, rank: int, deadline: float, device_label: str) -> None:
    store.set(f"device/{rank}", device_label)  # set before joining: whoever sees the join can read it
    if store.add(f"joined/{rank}", 1) > 1:
        raise ValueError(f"rank {rank} joined the sync group at {spec.host}:{spec.port} twice")
    keys = [f"joined/{other}" for other in range(spec.world_size)]
    while not store.check(keys):
        if time.monotonic() > deadline:
            joined = [other for other in range(spec.world_size) if store.check([keys[other]])]
            missing = sorted(set(range(spec.world_size)) - set(joined))
            raise WeightSyncError(
                f"weight sync rank {rank}: sync group at {spec.host}:{spec.port} waited {spec.timeout_s:g} s for "
                f"{spec.world_size} ranks; joined {joined}, missing {missing}"
            )
        time.sleep(_JOIN_POLL_S)
    if spec.backend == "nccl":
        # NCCL refuses two ranks on one GPU with an opaque "Duplicate GPU detected"; say which ranks collide.
        labels = [store.get(f"device/{other}").decode() for other in range(spec.world_size)]
        sharing = [other for other, label in enumerate(labels) if label == device_label]
        if len(sharing) > 1:
            raise ValueError(
                f"sync group ranks {sharing} are all on GPU {device_label}; nccl needs one GPU per rank "
                "(share a GPU through CUDA IPC or generate inside the training process instead)"
            )


def _gloo_backend(store: PrefixStore, spec: SyncGroupSpec, rank: int, timeout: datetime.timedelta) -> _Collectives:
    options = ProcessGroupGloo._Options()  # pyright: ignore[reportAttributeAccessIssue]  -- the stubs call it Options
    options._timeout = timeout
    # On a loopback host, bind gloo to loopback too: the default device resolves the machine's hostname, which
    # in containers can name an interface the other local processes cannot reach.
    if is_loopback(spec.host):
        options._devices = [ProcessGroupGloo.create_device(hostname=spec.host)]
    else:
        options._devices = [ProcessGroupGloo.create_default_device()]
    return cast(_Collectives, ProcessGroupGloo(store, rank, spec.world_size, options))


def _nccl_backend(
    store: PrefixStore, spec: SyncGroupSpec, rank: int, timeout: datetime.timedelta, device: torch.device
) -> _Collectives:
    from torch.distributed import ProcessGroupNCCL  # absent from CPU builds of torch

    torch.cuda.set_device(device)
    options = ProcessGroupNCCL.Options()
    # The NCCL watchdog may tear the process down when its timeout fires; set it past ours, so that the bounded
    # `wait` raises WeightSyncError first and `close` aborts the communicator.
    options._timeout = timeout * 2 + datetime.timedelta(seconds=30)
    backend = ProcessGroupNCCL(store, rank, spec.world_size, options)
    # Create the communicator now, bound to this device, instead of lazily at the first bucket.
    backend.eager_connect_single_device(device)
    return cast(_Collectives, backend)


def _device_label(device: torch.device) -> str:
    if device.type != "cuda":
        return str(device)
    return str(torch.cuda.get_device_properties(device).uuid)  # unlike the index, the same across processes


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _first_line(error: BaseException) -> str:
    # torch appends C++ stack traces to its messages; the first line says what went wrong.
    lines = str(error).strip().splitlines()
    return lines[0] if lines else type(error).__name__
