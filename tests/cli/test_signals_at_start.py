"""SIGTERM and SIGINT while `asyncppo train` starts: at the first moment its handlers are in place (config and
imports), while Ray starts (its GCS is up, `ray.init` has not returned), and while the workers build, the command
exits 143 / 130 with one line saying so, no traceback, and no process of the run left behind. Stops during training
are tests/integration/test_async_training.py's; what each signal does when is tests/trainer/test_stopping.py's.

One run of the CPU demo per moment, each ended by its signal: a run costs a process, its imports and Ray.
"""

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.slow]
REPO = Path(__file__).parents[2]
DEMO = REPO / "examples" / "configs" / "demo.yaml"
SIGTERM_CAUGHT = 1 << (signal.SIGTERM - 1)  # its bit in /proc/PID/status's SigCgt mask


def _status_field(pid: int, name: str) -> str | None:
    try:
        lines = Path(f"/proc/{pid}/status").read_text().splitlines()
    except OSError:
        return None
    return next((line.split(":", 1)[1].strip() for line in lines if line.startswith(f"{name}:")), None)


def _session_processes(session_id: int) -> dict[int, str]:
    """The live processes of the session the test started (the command, Ray's daemons and workers): pid -> command."""
    found: dict[int, str] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            command = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue  # it ended while the test looked
        if int(fields[3]) == session_id and fields[0] != "Z":  # field 6: the session; a zombie holds nothing
            found[int(entry.name)] = command
    return found


def _handlers_installed(pid: int) -> bool:
    caught = _status_field(pid, "SigCgt")
    return caught is not None and int(caught, 16) & SIGTERM_CAUGHT != 0


def _ray_starting(pid: int) -> bool:
    return any("gcs_server" in command for command in _session_processes(pid).values())


def _workers_building(pid: int) -> bool:
    return any("WorkerHost" in command for command in _session_processes(pid).values())


MOMENTS: dict[str, Callable[[int], bool]] = {
    "handlers_installed": _handlers_installed,
    "ray_starting": _ray_starting,
    "workers_building": _workers_building,
}


@pytest.mark.parametrize(
    ("moment", "signum"),
    [
        pytest.param("handlers_installed", signal.SIGINT, id="sigint_once_the_handlers_are_in_place"),
        pytest.param("ray_starting", signal.SIGTERM, id="sigterm_while_ray_starts"),
        pytest.param("workers_building", signal.SIGTERM, id="sigterm_while_the_workers_build"),
    ],
)
def test_a_signal_while_the_run_starts_exits_128_plus_n_with_one_line_and_leaves_no_process(
    moment: str, signum: signal.Signals, tmp_path: Path, shared_cache_dir: Path
) -> None:
    log = tmp_path / "train.log"
    data = REPO / "examples" / "data" / "arithmetic"
    command = [
        sys.executable,
        *("-m", "asyncppo", "train", str(DEMO), "--run-dir", str(tmp_path / "run")),
        f"data.train_path={data / 'train.jsonl'}",
        f"data.validation_path={data / 'validation.jsonl'}",
    ]
    env = {**os.environ, "ASYNCPPO_CACHE_DIR": str(shared_cache_dir)}
    with log.open("wb") as out:
        # A session of its own holds the command and every process Ray starts for it, so the test finds exactly those.
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    try:
        deadline = time.monotonic() + 180
        while not MOMENTS[moment](process.pid):
            assert process.poll() is None, f"ended before {moment}:\n{log.read_text()[-3000:]}"
            assert time.monotonic() < deadline, f"no {moment} within 180 s:\n{log.read_text()[-3000:]}"
            time.sleep(0.02)
        process.send_signal(signum)
        status = process.wait(timeout=60)
        deadline = time.monotonic() + 30  # Ray's daemons end once told to (SIGTERM, then SIGKILL after a grace period)
        while _session_processes(process.pid) and time.monotonic() < deadline:
            time.sleep(0.2)
        left = _session_processes(process.pid)
    finally:
        for pid in _session_processes(process.pid):
            os.kill(pid, signal.SIGKILL)
        process.kill()
        process.wait()
    output = log.read_text()
    name = signal.Signals(signum).name
    assert status == 128 + signum and "Traceback" not in output, output[-3000:]
    assert [line for line in output.splitlines() if name in line] == [
        f"stopped by {name} while the run was starting: nothing trained"
    ], output[-3000:]
    assert left == {}, left
