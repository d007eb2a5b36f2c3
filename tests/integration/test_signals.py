"""`asyncppo train` stopped by SIGTERM, then (resumed) by SIGINT: each exits within 60 s with 143 / 130 and no
traceback, having checkpointed the step it stopped after, and the next run resumes from that checkpoint (the
SIGINT run is that next run; both stops write their checkpoint through the same path)."""

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.slow]
REPO = Path(__file__).parents[2]
STOP_BOUND_S = 60
# The CPU demo on the tiny model (built in seconds; the demo's own model takes minutes to build), with nothing
# but training steps: no validation, no scheduled checkpoint before the stop.
OVERRIDES = [
    "model.model_name=tiny:tiny",
    "model.scheduler.warmup_steps=0",
    "checkpointing.save_period=1000",
    "ppo.val_at_start=false",
    "ppo.val_period=0",
    "ppo.val_at_end=false",
    "logger.console=false",
]


def _session_processes(session_id: int) -> list[int]:
    """PIDs of the processes in the session the test started (the driver, Ray's daemons and workers)."""
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):  # it may have exited since it was listed
                if int((entry / "stat").read_text().rsplit(")", 1)[1].split()[3]) == session_id:
                    pids.append(int(entry.name))
    return pids


def _kill_session(session_id: int) -> None:
    """End whatever the run left behind (nothing, when it stopped cleanly)."""
    for pid in _session_processes(session_id):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def _start(run_dir: Path, cache_dir: Path, log: Path, max_num_steps: int) -> subprocess.Popen[bytes]:
    command = [sys.executable, "-m", "asyncppo", "train", str(REPO / "examples" / "configs" / "demo.yaml")]
    command += ["--run-dir", str(run_dir), f"ppo.max_num_steps={max_num_steps}", *OVERRIDES]
    with log.open("wb") as out:
        # A new session holds the driver and every process Ray starts for it, so the test can end exactly those.
        return subprocess.Popen(
            command,
            cwd=REPO,
            stdout=out,
            stderr=subprocess.STDOUT,
            env={**os.environ, "ASYNCPPO_CACHE_DIR": str(cache_dir)},
            start_new_session=True,
        )


def _num_logged_steps(run_dir: Path) -> int:
    path = run_dir / "metrics.jsonl"
    return len(path.read_text().splitlines()) if path.exists() else 0


def _stop_after_a_step(run_dir: Path, cache_dir: Path, log: Path, stop: signal.Signals) -> int:
    """Start a long run, send `stop` once it has completed a step; returns the exit status."""
    logged_before = _num_logged_steps(run_dir)
    process = _start(run_dir, cache_dir, log, max_num_steps=1000)
    try:
        deadline = time.monotonic() + 300
        while _num_logged_steps(run_dir) == logged_before and process.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
        assert process.poll() is None, f"the run exited before its first step:\n{log.read_text()[-3000:]}"
        process.send_signal(stop)
        try:
            return process.wait(timeout=STOP_BOUND_S)
        except subprocess.TimeoutExpired:
            pytest.fail(f"{stop.name}: still running {STOP_BOUND_S} s later:\n{log.read_text()[-3000:]}")
    finally:
        _kill_session(process.pid)


def test_sigterm_and_sigint_stop_with_a_checkpoint_that_the_next_run_resumes(cache_dir: Path, tmp_path: Path):
    run_dir = tmp_path / "run"
    checkpoint = None
    for stop, expected_status in ((signal.SIGTERM, 143), (signal.SIGINT, 130)):
        log = tmp_path / f"{stop.name}.log"
        status = _stop_after_a_step(run_dir, cache_dir, log, stop)
        output = log.read_text()
        assert status == expected_status, output[-3000:]
        assert "Traceback" not in output, output[-3000:]
        if checkpoint is not None:  # the SIGINT run started from the SIGTERM run's checkpoint
            assert f"resumed from {checkpoint} " in output, output[-3000:]
        # The step it stopped after is the last one logged, and its checkpoint is the one the line names.
        step = _num_logged_steps(run_dir)
        checkpoint = run_dir / "checkpoints" / f"step_{step}"
        assert f"stopped by {stop.name} after step {step}: checkpoint {checkpoint}\n" in output, output[-3000:]
        assert (checkpoint / "training_info.json").is_file()
