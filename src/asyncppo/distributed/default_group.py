"""Joining torch.distributed's default process group: the data-parallel ranks of one trainer group (the policy's,
or the critic's), each in its own host process, before the worker shards its model over them with FSDP2.

    driver: rank 0's host reports its node IP and a free port --> Rendezvous(host, port, world_size, backend)
    every rank: join_default_group(rendezvous, rank) --> TCPStore on host:port (rank 0 listens there only)
                                                     --> dist.init_process_group(backend, store=..., rank, world)

The store is unauthenticated, so rank 0 listens on the node's own address (127.0.0.1 on a local cluster), never
on every interface, as torch's `tcp://` rendezvous would.
"""

import datetime
import os
import sys
import time
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch.distributed import PrefixStore  # pyright: ignore[reportPrivateImportUsage]

from asyncppo.distributed.process_group import is_loopback, open_store

_STORE_PREFIX = "asyncppo/data_parallel"


@dataclass(frozen=True)
class Rendezvous:
    """Where the ranks of one data-parallel group meet."""

    host: str
    """The node IP of rank 0's process; its store listens there only."""
    port: int
    world_size: int
    backend: str
    """`gloo` (CPU) or `nccl` (CUDA: one GPU per rank)."""
    timeout_s: float
    """Bound on the join and on every collective of the group."""


def join_default_group(rendezvous: Rendezvous, rank: int) -> None:
    """Make this process rank `rank` of torch.distributed's default group; RuntimeError naming the rendezvous when
    the ranks do not all arrive within the timeout."""
    where = f"{rendezvous.host}:{rendezvous.port}"
    if rendezvous.backend == "gloo" and is_loopback(rendezvous.host) and sys.platform == "linux":
        # gloo otherwise binds to the address of the machine's hostname, which in containers can name an interface
        # the other local processes cannot reach; a loopback rendezvous means every rank is on this machine.
        os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    if rendezvous.backend == "nccl":
        torch.cuda.set_device(0)  # Ray shows each host process its own GPU as device 0
    deadline = time.monotonic() + rendezvous.timeout_s
    try:
        store = open_store(rendezvous.host, rendezvous.port, rank, deadline)
        dist.init_process_group(
            rendezvous.backend,
            store=PrefixStore(_STORE_PREFIX, store),
            rank=rank,
            world_size=rendezvous.world_size,
            timeout=datetime.timedelta(seconds=rendezvous.timeout_s),
        )
    except (RuntimeError, OSError) as error:  # DistStoreError is a RuntimeError; timeouts are OSError
        first_line = (str(error).strip().splitlines() or [type(error).__name__])[0]
        raise RuntimeError(
            f"data-parallel rank {rank} of {rendezvous.world_size} could not join the group at {where} within "
            f"{rendezvous.timeout_s:g} s: {first_line}"
        ) from error
