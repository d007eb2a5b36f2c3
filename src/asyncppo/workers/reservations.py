"""Devices reserved on the Ray cluster before any worker starts: one placement group per pool of devices.

    Reservation.reserve("trainers", 2 devices, "GPU") --> placement group [{GPU: 1}, {GPU: 1}] (PACK)
        slot(0) -> policy rank 0 (+ critic rank 0, half a device each) ; slot(1) -> policy rank 1 (+ critic rank 1)
    Reservation.reserve("generators", 2 devices, "GPU") --> [{GPU: 1}, {GPU: 1}] (PACK): generator ranks 0, 1

A device is one GPU on CUDA runs and one logical CPU on CPU runs. A pool larger than the whole cluster fails at
once; one that fits the totals but cannot be placed (other jobs, fragmented nodes) fails after a timeout. Both
errors name what was asked and what the cluster has, instead of Ray waiting forever for the resources.
"""

from collections.abc import Sequence
from typing import Any, Literal

import ray
from ray.exceptions import GetTimeoutError
from ray.util.placement_group import placement_group, remove_placement_group

from asyncppo.workers.host_pool import DeviceSlot, keep_hosts, keep_placement, keeping_hosts, take_placement
from asyncppo.workers.ray_host import WorkerGroup

DeviceResource = Literal["GPU", "CPU"]


class PlacementError(RuntimeError):
    """The cluster cannot hold a pool of devices; the message names the numbers."""


class Reservation:
    """A pool of devices held as one Ray placement group until `release`."""

    def __init__(self, name: str, placement: Any, count: int, resource: DeviceResource = "CPU") -> None:
        self.name = name
        self.placement = placement
        self.count = count
        self.resource = resource

    @staticmethod
    def reserve(name: str, count: int, resource: DeviceResource, timeout_s: float) -> "Reservation":
        """Hold `count` devices of `resource`, packed on as few nodes as they fit; wait at most `timeout_s`. A
        placement group an earlier run of this process kept (`host_pool.py`) under the same name and size is
        taken instead."""
        if keeping_hosts() and (kept := take_placement(name, count, resource)) is not None:
            return Reservation(name, kept, count, resource)
        total = ray.cluster_resources().get(resource, 0.0)
        if count > total:
            raise PlacementError(f"the {name} need {count} {resource} devices but the Ray cluster has {total:g} in all")
        placement = placement_group([{resource: 1.0} for _ in range(count)], strategy="PACK", name=f"asyncppo-{name}")
        try:
            ray.get(placement.ready(), timeout=timeout_s)
        except GetTimeoutError:
            remove_placement_group(placement)
            free = ray.available_resources().get(resource, 0.0)
            raise PlacementError(
                f"the {name} need {count} {resource} devices; the Ray cluster has {total:g} in all, {free:g} free, "
                f"and could not place them within {timeout_s:.0f} s (held by other jobs, or split across nodes)"
            ) from None
        return Reservation(name, placement, count, resource)

    def slot(self, index: int) -> DeviceSlot:
        if not 0 <= index < self.count:
            raise IndexError(f"{self.name}: slot {index} of {self.count}")
        return DeviceSlot(self.placement, index)

    def slots(self) -> list[DeviceSlot]:
        return [self.slot(index) for index in range(self.count)]

    def release(self) -> None:
        """Give the devices back (the workers placed on them must be ended first)."""
        remove_placement_group(self.placement)


def stop_workers(
    groups: Sequence[WorkerGroup[object]], reservations: Sequence[Reservation], keep: bool = False
) -> None:
    """End every host of `groups`, then give the devices of `reservations` back; with `keep` (a run that ended well)
    and ASYNCPPO_KEEP_WORKER_PROCESSES=1, reset the hosts and keep them and the devices for the next run instead."""
    if keep and keeping_hosts():
        keep_hosts(
            [
                (host, slot, group.options)
                for group in groups
                for host, slot in zip(group.hosts, group.slots, strict=True)
            ]
        )
        for reservation in reservations:
            keep_placement(reservation.name, reservation.count, reservation.resource, reservation.placement)
        return
    for group in groups:
        group.kill()
    for reservation in reservations:
        reservation.release()
