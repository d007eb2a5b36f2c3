"""Worker processes kept between runs of one driver (ASYNCPPO_KEEP_WORKER_PROCESSES=1), on real Ray hosts: a run that
ends well leaves its hosts reset (worker closed and dropped, random generators as the process started) and its
placement group kept; the next run of the same shape takes both; a run of another shape drains them first; without
the switch, or after a failure, hosts end and devices go back."""

import os
import time
from collections.abc import Callable
from typing import Any

import pytest
import ray

from asyncppo.workers import host_pool
from asyncppo.workers.ray_cluster import init_local_ray
from asyncppo.workers.ray_host import HostOptions, WorkerGroup, wait_until_built
from asyncppo.workers.reservations import Reservation, stop_workers

pytestmark = pytest.mark.integration
HOST = HostOptions(num_cpus=0)


@pytest.fixture(scope="module", autouse=True)
def _cluster() -> None:
    init_local_ray(num_cpus=4)  # as tests/integration/conftest.py: whichever module starts it, the others join


@pytest.fixture(autouse=True)
def _keeping(monkeypatch: pytest.MonkeyPatch):
    host_pool.drain()  # what an earlier run of this test process kept (the suite keeps hosts) is ended first
    _wait_for_free_cpus(ray.cluster_resources()["CPU"])
    monkeypatch.setenv(host_pool.KEEP_ENV, "1")
    yield
    host_pool.drain()  # nothing kept leaks into the next test


def _wait_for_free_cpus(expected: float) -> None:
    """Ray frees a removed placement group's devices asynchronously."""
    deadline = time.monotonic() + 30
    while ray.available_resources().get("CPU", 0.0) != expected and time.monotonic() < deadline:
        time.sleep(0.1)
    assert ray.available_resources().get("CPU", 0.0) == expected


def _drawing(close_fails: bool) -> Callable[[], object]:
    """A factory (a closure, pickled by value with the class it defines) of a worker that records its process and
    a draw from torch's generator made when it is built; its close fails when `close_fails`."""

    def build() -> object:
        import torch

        class Drawn:
            def __init__(self) -> None:
                self.pid, self.draw = os.getpid(), torch.rand(3).tolist()

            def state(self) -> tuple[int, list[float]]:
                return self.pid, self.draw

            def close(self) -> None:
                if close_fails:
                    raise RuntimeError("close failed")

        return Drawn()

    return build


def _start(count: int, close_fails: bool = False) -> tuple[Reservation, WorkerGroup[Any]]:
    reservation = Reservation.reserve("trainers", count, "CPU", timeout_s=30.0)
    factories = [_drawing(close_fails) for _ in range(count)]
    starting = WorkerGroup.launch("policy", factories, HOST, 60.0, reservation.slots())
    wait_until_built([starting])
    return reservation, starting.group


def _states(group: WorkerGroup[Any]) -> list[tuple[int, list[float]]]:
    return [tuple(state) for state in ray.get([host.call.remote("state") for host in group.hosts], timeout=30)]


def test_a_host_whose_reset_fails_is_ended_while_its_placement_is_kept():
    reservation, group = _start(1, close_fails=True)
    placement = reservation.placement
    (first,) = _states(group)
    stop_workers([group], [reservation], keep=True)  # the worker's close raises, so the reset fails
    assert host_pool._idle_hosts == {}  # pyright: ignore[reportPrivateUsage]
    with pytest.raises(ray.exceptions.RayActorError):
        ray.get(group.hosts[0].call.remote("state"), timeout=30)
    again, group = _start(1)
    assert again.placement.id == placement.id
    assert _states(group)[0][0] != first[0]  # a new process in the kept slot
    stop_workers([group], [again], keep=False)


def test_the_next_run_of_the_same_shape_takes_the_kept_placement_and_hosts_reset_to_fresh():
    reservation, group = _start(1)
    first = _states(group)
    placement = reservation.placement
    stop_workers([group], [reservation], keep=True)
    again, group = _start(1)
    assert again.placement.id == placement.id
    # The same process (no import paid again), and the draw a fresh process makes: the generator was restored.
    assert _states(group) == first
    stop_workers([group], [again], keep=True)
    # Another shape drains what was kept (its hosts end, its devices go back) before reserving anew.
    other, bigger = _start(2)
    assert other.placement.id != placement.id
    assert {pid for pid, _ in _states(bigger)}.isdisjoint({pid for pid, _ in first})
    with pytest.raises(ray.exceptions.RayActorError):
        ray.get(group.hosts[0].call.remote("state"), timeout=30)
    stop_workers([bigger], [other], keep=False)
    assert host_pool._free_placements == []  # pyright: ignore[reportPrivateUsage]


def test_without_the_switch_hosts_end_and_devices_go_back(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv(host_pool.KEEP_ENV, "0")
    reservation, group = _start(1)
    stop_workers([group], [reservation], keep=True)
    with pytest.raises(ray.exceptions.RayActorError):
        ray.get(group.hosts[0].call.remote("state"), timeout=30)
    assert host_pool._idle_hosts == {} and host_pool._free_placements == []  # pyright: ignore[reportPrivateUsage]
    _wait_for_free_cpus(ray.cluster_resources()["CPU"])  # every device given back
