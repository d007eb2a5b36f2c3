"""Starting a run's workers on the Ray cluster: devices reserved first, then the ranks placed on them, then the
weight sync between the policy and the generators.

    Reservation "trainers"   (layout.trainer_devices): policy rank i on device i; critic rank i on device i (half a
                              device each), or on device policy_ranks + i with value.own_devices
    Reservation "generators" (layout.generators):      generator rank k on device k
    policy ranks: one data-parallel group (FSDP2), meeting at policy rank 0's node; critic ranks: another
    WeightSync: policy rank 0 + every generator, meeting at policy rank 0's node IP

A device is one GPU on CUDA runs and one logical CPU on CPU runs (`workers/reservations.py`). `placement.json` in
the run directory records where every rank ran.
"""

import json
import os
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from asyncppo.config import ConfigError, RunConfig
from asyncppo.distributed.process_group import SyncGroupSpec
from asyncppo.generation.engines import EngineSettings
from asyncppo.trainer import builders
from asyncppo.trainer.placement import Layout, ray_address
from asyncppo.trainer.run import WORKER_CALL_TIMEOUT_S
from asyncppo.workers.generator_group import GeneratorGroup
from asyncppo.workers.groups import PolicyGroup, ValueGroup, WeightSync
from asyncppo.workers.ray_host import HostOptions, StartingGroup, WorkerGroup, wait_until_built
from asyncppo.workers.reservations import DeviceResource, PlacementError, Reservation, stop_workers

PLACEMENT_TIMEOUT_S = 120.0
"""How long a reservation may wait for the cluster's devices before the run fails naming the numbers."""
PLACEMENT_FILE = "placement.json"


@dataclass
class StartedWorkers:
    """The run's worker groups and the reservations they sit on; `stop` ends them all."""

    policy: PolicyGroup
    value: ValueGroup | None
    generator: GeneratorGroup
    weight_sync: WeightSync | None
    groups: list[WorkerGroup[object]] = field(default_factory=list[WorkerGroup[object]])
    reservations: list[Reservation] = field(default_factory=list[Reservation])


def ray_start_options(config: RunConfig, layout: Layout, gpu: bool) -> dict[str, Any]:
    """Keyword arguments of `init_local_ray`: the cluster to join, or the size of a local one (a CPU run gets at
    least one logical CPU per device)."""
    cluster = config.cluster
    num_cpus = cluster.num_cpus
    if not gpu and num_cpus is None:
        num_cpus = max(os.cpu_count() or 1, layout.total)
    return {"num_cpus": num_cpus, "num_gpus": cluster.gpus_per_node or None, "address": ray_address(config)}


def _host_options(gpu: bool, share: float, max_concurrency: int = 1) -> HostOptions:
    # On CPU every host gets one torch thread: in the sync loop only one host computes at a time, and on a
    # shared 2-core machine a second OpenMP thread spin-waits far more than it helps (measured ~10x slower).
    return HostOptions(
        num_cpus=0 if gpu else share,
        num_gpus=share if gpu else 0,
        max_concurrency=max_concurrency,
        torch_threads=None if gpu else 1,
    )


def _reserve(name: str, count: int, resource: DeviceResource) -> Reservation:
    try:
        return Reservation.reserve(name, count, resource, PLACEMENT_TIMEOUT_S)
    except PlacementError as error:
        raise ConfigError(
            [f"cluster: {error}; lower the run's devices (docs/multi-node.md) or grow the cluster"]
        ) from None


def start_workers(
    config: RunConfig, paths: builders.ModelPaths, device: str, engine: EngineSettings, layout: Layout
) -> StartedWorkers:
    """Reserve the devices, start every rank on them and connect weight sync; on failure nothing is left running."""
    gpu = device == "cuda"
    resource: DeviceResource = "GPU" if gpu else "CPU"
    backend = "nccl" if gpu else "gloo"
    colocated = config.generation.colocated.enabled
    groups: list[WorkerGroup[object]] = []
    reservations: list[Reservation] = []
    try:
        trainers = _reserve("trainers", layout.trainer_devices, resource)
        reservations.append(trainers)
        slots = trainers.slots()
        shared = layout.critic_ranks > 0 and not layout.critic_own_devices
        # Every group is launched before any is waited for: the workers import and load their models at the same
        # time (started one group after another, a one-step CPU demo run took ~5 s longer).
        starting: list[StartingGroup[Any]] = []
        policy_start = WorkerGroup.launch(
            "policy",
            [builders.policy_factory(config, paths, device, engine if colocated else None)] * layout.policy_ranks,
            _host_options(gpu, 0.5 if shared else 1.0, max_concurrency=4),
            WORKER_CALL_TIMEOUT_S,
            slots=slots[: layout.policy_ranks],
            data_parallel=backend,
        )
        groups.append(policy_start.group)
        starting.append(policy_start)
        value_start = None
        if layout.critic_ranks:
            value_start = WorkerGroup.launch(
                "value",
                [builders.value_factory(config, paths, device)] * layout.critic_ranks,
                _host_options(gpu, 0.5 if shared else 1.0),
                WORKER_CALL_TIMEOUT_S,
                slots=slots[: layout.critic_ranks] if shared else slots[layout.policy_ranks :],
                data_parallel=backend,
            )
            groups.append(value_start.group)
            starting.append(value_start)
        generator_start = None
        if not colocated:
            generators = _reserve("generators", layout.generators, resource)
            reservations.append(generators)
            generator_start = WorkerGroup.launch(
                "generator",
                [builders.generator_factory(config, paths, device, engine, rank) for rank in range(layout.generators)],
                # Every concurrent rollout must reach the engine's queue to share its batches: with fewer actor
                # threads than in-flight groups, Ray queues the calls and batches shrink to the thread count.
                _host_options(gpu, 1.0, max_concurrency=max(64, 2 * config.generation.max_batch_size)),
                WORKER_CALL_TIMEOUT_S,
                slots=generators.slots(),
            )
            groups.append(generator_start.group)
            starting.append(generator_start)
        wait_until_built(starting)
        policy_group = policy_start.group
        value = None if value_start is None else ValueGroup(value_start.group)
        if generator_start is None:
            return StartedWorkers(
                PolicyGroup(policy_group), value, GeneratorGroup(policy_group), None, groups, reservations
            )
        generator_group = generator_start.group
        sync = config.generation.weight_sync
        host, port = policy_group.rendezvous_address(0)  # rank 0 hosts the sync store, on its node's own address
        spec = SyncGroupSpec(host, port, 1 + len(generator_group), backend, sync.timeout_s)
        weight_sync = WeightSync(policy_group, generator_group, spec, sync)
        return StartedWorkers(
            PolicyGroup(policy_group), value, GeneratorGroup(generator_group), weight_sync, groups, reservations
        )
    except BaseException:
        stop_workers(groups, reservations)
        raise


def write_placement(path: Path, groups: Sequence[WorkerGroup[object]]) -> list[dict[str, Any]]:
    """Record where every rank runs (role, rank, Ray node id, node IP) in `path`; returns the records."""
    records = [
        {"role": group.name, "rank": rank, **asdict(location)}
        for group in groups
        for rank, location in enumerate(group.locations())
    ]
    path.write_text(json.dumps(records, indent=1) + "\n")
    return records


def placement_summary(records: Sequence[dict[str, Any]]) -> str:
    """One line: each role's ranks and the node IPs they run on."""
    roles: dict[str, list[str]] = {}
    for record in records:
        roles.setdefault(record["role"], []).append(record["node_ip"])
    parts = [f"{role} x{len(ips)} on {', '.join(sorted(set(ips)))}" for role, ips in roles.items()]
    return "placement: " + "; ".join(parts)
