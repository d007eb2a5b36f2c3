"""Starting worker groups on real Ray hosts: groups launched before one wait build at the same time, and a build
that fails is reported at once, naming its group and rank, while another group's build is still running."""

import time
from collections.abc import Callable
from pathlib import Path

import pytest

from asyncppo.workers.ray_cluster import init_local_ray
from asyncppo.workers.ray_host import HostOptions, WorkerCallError, WorkerGroup, wait_until_built

pytestmark = pytest.mark.integration
HOST = HostOptions(num_cpus=0)


@pytest.fixture(scope="module", autouse=True)
def _cluster() -> None:
    # As tests/integration/conftest.py (whichever module starts the session's cluster, the others join it).
    init_local_ray(num_cpus=4)


def _recording_build(record: Path, seconds: float) -> Callable[[], object]:
    """A factory (pickled by value: a closure) that writes when it started and ended building into `record`."""

    def build() -> object:
        started = time.time()
        time.sleep(seconds)
        record.write_text(f"{started} {time.time()}")
        return object()

    return build


def _failing_build(message: str) -> Callable[[], object]:
    """A factory (a closure, as above) that raises ValueError(message)."""

    def build() -> object:
        raise ValueError(message)

    return build


def test_groups_launched_before_the_wait_build_at_the_same_time(tmp_path: Path):
    records = [tmp_path / "policy", tmp_path / "generator"]
    starting = [
        WorkerGroup.launch("policy", [_recording_build(records[0], 3.0)], HOST, timeout_s=60.0),
        WorkerGroup.launch("generator", [_recording_build(records[1], 3.0)], HOST, timeout_s=60.0),
    ]
    try:
        wait_until_built(starting)
        (policy_start, policy_end), (generator_start, generator_end) = (
            [float(value) for value in record.read_text().split()] for record in records
        )
        # The builds overlap: each started before the other ended (one after the other, one would start 3 s
        # after the other ended).
        assert policy_start < generator_end and generator_start < policy_end
    finally:
        for one in starting:
            one.group.kill()


def test_a_failed_build_is_raised_at_once_naming_its_group_while_another_still_builds(tmp_path: Path):
    slow = WorkerGroup.launch("policy", [_recording_build(tmp_path / "slow", 60.0)], HOST, timeout_s=120.0)
    broken = WorkerGroup.launch("generator", [_failing_build("no weights at /nowhere")], HOST, timeout_s=120.0)
    started = time.monotonic()
    try:
        with pytest.raises(WorkerCallError, match=r"generator\[0\]\.build failed: ValueError: no weights at /nowhere"):
            wait_until_built([slow, broken])
        assert time.monotonic() - started < 45.0  # not after the 60 s policy build
        assert not (tmp_path / "slow").exists()
    finally:
        slow.group.kill()
        broken.group.kill()
