"""Starting a run's workers on the Ray cluster: devices reserved first, then the ranks placed on them, then the
weight sync between the policy and the generators.

    Reservation "trainers"   (layout.trainer_devices): policy rank i on device i; critic rank i on device i (half a
                              device each), or on device policy_ranks + i with value.own_devices
    Reservation "generators" (layout.generators):      generator rank k on device k
    policy ranks: one data-parallel group (FSDP2), meeting at policy rank 0's node; critic ranks: another
    WeightSync: policy rank 0 + every generator, meeting at policy rank 0's node IP
    GeneratorSupervisor: restarts a generator process that dies (generation.max_restarts) and pushes the weights

A device is one GPU on CUDA runs and one logical CPU on CPU runs (`workers/reservations.py`). `placement.json` in
the run directory records where every rank runs and its process id (a restarted generator's new one included).
"""

import json
import os
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from asyncppo.config import ConfigError, RunConfig
from asyncppo.distributed.process_group import SyncBackend, SyncGroupSpec
from asyncppo.trainer import builders
from asyncppo.trainer.placement import Layout, ray_address
from asyncppo.trainer.setup import RunSetup
from asyncppo.workers.generator_group import GeneratorGroup
from asyncppo.workers.generator_supervisor import GeneratorSupervisor
from asyncppo.workers.generator_worker import GeneratorWorker
from asyncppo.workers.groups import PolicyGroup, ValueGroup, WeightSync
from asyncppo.workers.host_pool import DeviceSlot, HostOptions
from asyncppo.workers.ray_host import Built, StartingGroup, WorkerGroup, quiet_worker_death_reports, wait_until_built
from asyncppo.workers.reservations import DeviceResource, PlacementError, Reservation, stop_workers

PLACEMENT_TIMEOUT_S = 120.0
"""How long a reservation may wait for the cluster's devices before the run fails naming the numbers."""
PLACEMENT_FILE = "placement.json"
WORKER_CALL_TIMEOUT_S = 3600.0
"""The longest a call of a worker group may take before the driver fails naming the call."""


@dataclass
class StartedWorkers:
    """The run's worker groups and the reservations they sit on; `stop` ends them all."""

    policy: PolicyGroup
    value: ValueGroup | None
    generator: GeneratorGroup
    weight_sync: WeightSync | None
    groups: list[WorkerGroup[object]] = field(default_factory=list[WorkerGroup[object]])
    reservations: list[Reservation] = field(default_factory=list[Reservation])
    """The devices the groups sit on, given back after the groups end."""
    supervisor: GeneratorSupervisor | None = None
    """Restarts dead generators and pushes the weights (None when generation is colocated)."""

    def stop(self, keep: bool = False) -> None:
        """Stop restarting generators, then end the groups and give their devices back (`keep`: see
        `stop_workers`)."""
        try:
            if self.supervisor is not None:
                self.supervisor.stop()
        finally:
            stop_workers(self.groups, self.reservations, keep)


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


@dataclass
class _Launches:
    """The devices reserved and the groups launched so far: `stop` ends them all when a start fails part-way."""

    backend: SyncBackend
    """torch.distributed backend of the trained groups and the weight sync: nccl on GPUs, gloo on CPU."""
    groups: list[WorkerGroup[object]] = field(default_factory=list[WorkerGroup[object]])
    reservations: list[Reservation] = field(default_factory=list[Reservation])
    starting: list[StartingGroup[Any]] = field(default_factory=list[StartingGroup[Any]])

    def reserve(self, name: str, count: int, resource: DeviceResource) -> Reservation:
        try:
            reservation = Reservation.reserve(name, count, resource, PLACEMENT_TIMEOUT_S)
        except PlacementError as error:
            raise ConfigError(
                [f"cluster: {error}; lower the run's devices (docs/multi-node.md) or grow the cluster"]
            ) from None
        self.reservations.append(reservation)
        return reservation

    def launch(
        self,
        name: str,
        factories: Sequence[Callable[[], Built]],
        options: HostOptions,
        slots: Sequence[DeviceSlot],
        trained: bool,
    ) -> WorkerGroup[Built]:
        """Start the group's hosts and send their builds; `trained` groups form one data-parallel group."""
        data_parallel = self.backend if trained else None
        start = WorkerGroup.launch(name, factories, options, WORKER_CALL_TIMEOUT_S, slots, data_parallel)
        self.groups.append(start.group)
        self.starting.append(start)
        return start.group


def start_workers(setup: RunSetup, layout: Layout) -> StartedWorkers:
    """Reserve the devices, start every rank on them and connect weight sync; on failure nothing is left running.

    Every group is launched before any is waited for: the workers import and load their models at the same time
    (started one group after another, a one-step CPU demo run took ~5 s longer).
    """
    gpu = setup.device == "cuda"
    resource: DeviceResource = "GPU" if gpu else "CPU"
    colocated = setup.config.generation.colocated.enabled
    quiet_worker_death_reports()  # a worker's death is named in one line (or its generator restarted), not by Ray
    launches = _Launches(backend="nccl" if gpu else "gloo")
    try:
        slots = launches.reserve("trainers", layout.trainer_devices, resource).slots()
        shared = layout.critic_ranks > 0 and not layout.critic_own_devices
        share = 0.5 if shared else 1.0
        policy_options = _host_options(gpu, share, max_concurrency=4)
        policy = launches.launch(
            "policy",
            [builders.policy_factory(setup, colocated)] * layout.policy_ranks,
            policy_options,
            slots[: layout.policy_ranks],
            trained=True,
        )
        value = None
        if layout.critic_ranks:
            critic_slots = slots[: layout.critic_ranks] if shared else slots[layout.policy_ranks :]
            factories = [builders.value_factory(setup)] * layout.critic_ranks
            value = launches.launch("value", factories, _host_options(gpu, share), critic_slots, trained=True)
        generators = None if colocated else _launch_generators(setup, layout, launches, resource, gpu)
        wait_until_built(launches.starting)
        value_group = None if value is None else ValueGroup(value)
        if generators is None:
            return StartedWorkers(
                PolicyGroup(policy), value_group, GeneratorGroup(policy), None, launches.groups, launches.reservations
            )
        sync = setup.config.generation.weight_sync
        host, port = policy.rendezvous_address(0)  # rank 0 hosts the sync store, on its node's own address
        spec = SyncGroupSpec(host, port, 1 + len(generators), launches.backend, sync.timeout_s)
        weight_sync = WeightSync(policy, generators, spec, sync)
        generator = GeneratorGroup(generators)
        supervisor = GeneratorSupervisor(generator, weight_sync, setup.config.generation.max_restarts)
        return StartedWorkers(
            PolicyGroup(policy),
            value_group,
            generator,
            weight_sync,
            launches.groups,
            launches.reservations,
            supervisor,
        )
    except BaseException:
        stop_workers(launches.groups, launches.reservations)
        raise


def _launch_generators(
    setup: RunSetup, layout: Layout, launches: _Launches, resource: DeviceResource, gpu: bool
) -> WorkerGroup[GeneratorWorker]:
    """The non-colocated generator ranks, one device each."""
    slots = launches.reserve("generators", layout.generators, resource).slots()
    # Every concurrent rollout must reach the engine's queue to share its batches: with fewer actor threads than
    # in-flight groups, Ray queues the calls and batches shrink to the thread count.
    options = _host_options(gpu, 1.0, max_concurrency=max(64, 2 * setup.config.generation.max_batch_size))
    factories = [builders.generator_factory(setup, rank) for rank in range(layout.generators)]
    return launches.launch("generator", factories, options, slots, trained=False)


def write_placement(path: Path, groups: Sequence[WorkerGroup[object]]) -> list[dict[str, Any]]:
    """Record where every rank runs (role, rank, process id, Ray node id, node IP) in `path`; returns the records."""
    records = [
        {"role": group.name, "rank": rank, "pid": group.pids[rank], **asdict(location)}
        for group in groups
        for rank, location in enumerate(group.locations())
    ]
    _write_records(path, records)
    return records


def record_restart(path: Path, role: str, rank: int, pid: int | None) -> None:
    """Put a restarted rank's new process id into the placement record at `path` (it keeps its slot)."""
    records = json.loads(path.read_text())
    for record in records:
        if (record["role"], record["rank"]) == (role, rank):
            record["pid"] = pid
    _write_records(path, records)


def _write_records(path: Path, records: list[dict[str, Any]]) -> None:
    # Written aside, then renamed: whoever reads it (an operator, a script looking for a process) never sees half.
    partial = path.with_name(path.name + ".tmp")
    partial.write_text(json.dumps(records, indent=1) + "\n")
    partial.replace(path)


def placement_summary(records: Sequence[dict[str, Any]]) -> str:
    """One line: each role's ranks and the node IPs they run on."""
    roles: dict[str, list[str]] = {}
    for record in records:
        roles.setdefault(record["role"], []).append(record["node_ip"])
    parts = [f"{role} x{len(ips)} on {', '.join(sorted(set(ips)))}" for role, ips in roles.items()]
    return "placement: " + "; ".join(parts)
