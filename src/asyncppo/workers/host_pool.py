"""Where a worker host runs (`HostOptions`, `DeviceSlot`) and the hosts a driver process keeps between its runs.

Starting a worker process costs seconds of CPU before it does any work (Python, Ray, torch and transformers
imports: about 7 s on a 2-core machine). A driver that runs several trainings one after another (a sweep or a
notebook calling `asyncppo.train` repeatedly, the test suite) may keep them: with `ASYNCPPO_KEEP_WORKER_PROCESSES=1`
a run that ends well hands its placement groups and its host processes back here instead of ending them, each
host first reset to the state of a fresh process (`WorkerHost.reset`: worker closed and dropped, the data-parallel
group destroyed, random number generators restored). The next run takes a kept placement group of the same name and
size and, in each of its slots, a kept host started with the same options; what it cannot take is drained (hosts
ended, placement groups removed) before it reserves anew, so kept devices never starve it.

    run A ends --keep_hosts--> idle hosts by (placement group, bundle, options) + free placement groups
    run B reserves "trainers" x1 CPU --take_placement--> the kept group | none: drain, reserve a new one
    run B starts a host in slot 0 --take_idle_host--> a kept host with the same options | none: start a new one

Off (the default), every run ends its hosts and gives its devices back, as a single `asyncppo train` does.
"""

import os
from dataclasses import dataclass
from typing import Any

import ray
from ray.exceptions import RayError
from ray.util.placement_group import remove_placement_group

KEEP_ENV = "ASYNCPPO_KEEP_WORKER_PROCESSES"
RESET_TIMEOUT_S = 60.0
"""A host that cannot reset within this is ended rather than kept."""


@dataclass(frozen=True)
class HostOptions:
    """Ray resources of one host actor."""

    num_cpus: float = 1.0
    num_gpus: float = 0.0
    max_concurrency: int = 1
    """Above 1 the actor runs calls in threads (generators batch concurrent requests)."""
    torch_threads: int | None = None


@dataclass(frozen=True)
class DeviceSlot:
    """One device of a reservation (`reservations.py`): where a worker host is started."""

    placement_group: Any
    """The Ray PlacementGroup."""
    bundle_index: int


@dataclass(frozen=True)
class _FreePlacement:
    name: str
    count: int
    resource: str
    placement: Any


_free_placements: list[_FreePlacement] = []
_idle_hosts: dict[tuple[str, int, HostOptions], list[Any]] = {}
_job_id: str | None = None
"""The Ray job the kept handles belong to: after a Ray shutdown and a new start they are stale."""


def keeping_hosts() -> bool:
    """Whether runs keep their hosts for the next run of this process (ASYNCPPO_KEEP_WORKER_PROCESSES=1)."""
    return os.environ.get(KEEP_ENV, "0") == "1"


def _slot_key(slot: DeviceSlot, options: HostOptions) -> tuple[str, int, HostOptions]:
    return slot.placement_group.id.hex(), slot.bundle_index, options


def _current_job() -> str:
    """Forget what was kept under an earlier Ray job (its processes ended with that cluster or connection)."""
    global _job_id
    job = ray.get_runtime_context().get_job_id()
    if job != _job_id:
        _free_placements.clear()
        _idle_hosts.clear()
        _job_id = job
    return job


def take_placement(name: str, count: int, resource: str) -> Any | None:
    """A kept placement group reserved under `name` for `count` devices of `resource`, or None after draining every
    kept one (the new reservation may need their devices)."""
    _current_job()
    for free in _free_placements:
        if (free.name, free.count, free.resource) == (name, count, resource):
            _free_placements.remove(free)
            return free.placement
    drain()
    return None


def take_idle_host(slot: DeviceSlot, options: HostOptions) -> Any | None:
    """A kept host in `slot` started with `options`, or None after ending the slot's other kept hosts: they hold
    the slot's share of its device, which the new host needs (a colocated policy and critic split one)."""
    _current_job()
    key = _slot_key(slot, options)
    idle = _idle_hosts.get(key)
    if idle:
        host = idle.pop()
        if not idle:
            del _idle_hosts[key]
        return host
    for other in [other for other in _idle_hosts if other[:2] == key[:2]]:
        for host in _idle_hosts.pop(other):
            ray.kill(host)
    return None


def keep_placement(name: str, count: int, resource: str, placement: Any) -> None:
    """Hold a placement group whose hosts were kept or ended, for a later run's reservation of the same shape."""
    _current_job()
    _free_placements.append(_FreePlacement(name, count, resource, placement))


def keep_hosts(hosts: list[tuple[Any, DeviceSlot | None, HostOptions]]) -> None:
    """Reset every host (all at once) and keep those that reset; a host outside a slot, or one that died or failed
    its reset, is ended."""
    _current_job()
    resets = [(host, slot, options, host.reset.remote()) for host, slot, options in hosts if slot is not None]
    for host, slot, _ in hosts:
        if slot is None:
            ray.kill(host)
    for host, slot, options, pending in resets:
        try:
            ray.get(pending, timeout=RESET_TIMEOUT_S)
        except (RayError, TimeoutError):
            ray.kill(host)  # a dead or stuck host is not worth keeping; killing a dead one is a no-op
            continue
        assert slot is not None
        _idle_hosts.setdefault(_slot_key(slot, options), []).append(host)


def drain() -> None:
    """End every kept idle host and remove every free placement group (those a run holds now stay)."""
    held = {free.placement.id.hex() for free in _free_placements}
    for key in [key for key in _idle_hosts if key[0] in held]:
        for host in _idle_hosts.pop(key):
            ray.kill(host)
    for free in _free_placements:
        remove_placement_group(free.placement)
    _free_placements.clear()
