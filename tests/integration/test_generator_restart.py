"""Elastic generators, end to end on the demo (`asyncppo train`, in this process, on the session's Ray cluster): a
generator process SIGKILLed mid-run is restarted in place and brought to the current weights, and the run finishes
every step with its books exact (every prompt drawn trained once, none lost, none dropped as failed) and one console
line for the restart; past generation.max_restarts the run ends with one line naming the generator, the step and
the cause, and exit status 1, without a traceback. The generator's process id is read from the run's
placement.json, which names every rank's process (a restarted one's new id included).

Sync runs reach the same restart through the batch source's retry; tests/pipeline/test_generator_deaths.py pins what
the sources do with the groups a death cost.
"""

import json
import os
import re
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from asyncppo.cli.main import main

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.usefixtures("ray_cluster")]
REPO = Path(__file__).parents[2]
DEMO = str(REPO / "examples" / "configs" / "demo.yaml")
DATA = REPO / "examples" / "data" / "arithmetic"
SHORT_DEMO = [
    f"data.train_path={DATA / 'train.jsonl'}",
    f"data.validation_path={DATA / 'validation.jsonl'}",
    "ppo.val_period=0",
    "ppo.val_at_start=false",
    "ppo.val_at_end=false",
    "ppo.async_ppo.watchdog_timeout_s=120",
    "logger.console=false",
]
RESTART_LINE = re.compile(
    r"^generator rank 0, pid (\d+) died during step (\d+): its process ended unexpectedly[^;]*; restarting it in "
    r"1 s \(restart 1 of generation\.max_restarts=(\d+)\)$",
    re.MULTILINE,
)
NOISE = ("Traceback", "Unhandled error", "ActorDiedError", "OOM", "A worker died")


def _completed_steps(run_dir: Path) -> int:
    path = run_dir / "metrics.jsonl"
    if not path.is_file():
        return 0
    return max((json.loads(line)["step"] for line in path.read_text().splitlines() if line.strip()), default=0)


def _generator_pid(run_dir: Path) -> int | None:
    try:
        records = json.loads((run_dir / "placement.json").read_text())
    except (OSError, ValueError):  # not written yet
        return None
    return next(record["pid"] for record in records if record["role"] == "generator")


class Killer:
    """Kills the run's generator process (SIGKILL, by pid) each time `when(run_dir, killed)` holds, from a thread."""

    def __init__(self, run_dir: Path, when: Callable[[Path, list[int]], bool], times: int) -> None:
        self.killed: list[int] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, args=(run_dir, when, times), daemon=True)
        self._thread.start()

    def _watch(self, run_dir: Path, when: Callable[[Path, list[int]], bool], times: int) -> None:
        while len(self.killed) < times and not self._stop.wait(0.05):
            pid = _generator_pid(run_dir)
            if pid is not None and pid not in self.killed and when(run_dir, self.killed):
                os.kill(pid, signal.SIGKILL)
                self.killed.append(pid)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)


def test_a_killed_generator_comes_back_and_the_async_demo_trains_every_prompt_exactly_once(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
):
    run_dir, steps = tmp_path / "run", 6
    killer = Killer(run_dir, lambda run_dir, _: _completed_steps(run_dir) >= 2, times=1)
    try:
        status = main(
            [
                "train",
                DEMO,
                "--run-dir",
                str(run_dir),
                *SHORT_DEMO,
                f"ppo.max_num_steps={steps}",
                f"checkpointing.save_period={steps}",
                f"ppo.async_ppo.log_every={steps}",
            ]
        )
    finally:
        killer.stop()
    out, err = capsys.readouterr()
    assert status == 0, (out + err)[-3000:]
    assert len(killer.killed) == 1, "the run ended before the generator could be killed"
    restarts = RESTART_LINE.findall(out)
    assert len(restarts) == 1 and int(restarts[0][0]) == killer.killed[0] and restarts[0][2] == "3", out[-3000:]
    assert not [noise for noise in NOISE if noise in out + err], (out + err)[-3000:]

    metrics = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == list(range(1, steps + 1))
    assert metrics[0]["generation/restarts"] == 0.0 and metrics[-1]["generation/restarts"] == 1.0
    # The books: every draw trained exactly once or still waiting; nothing lost to the death, nothing dropped.
    books = json.loads((run_dir / "checkpoints" / f"step_{steps}" / "accounting.json").read_text())
    assert books["problems"] == [] and books["dropped"] == {}
    assert books["trained"] == [[0, steps * 32]]  # the demo's 32 prompts per step, each id once
    trained = sum(end - start for start, end in books["trained"])
    assert trained + len(books["buffered"]) + len(books["pending"]) == books["next_draw_id"]
    assert f"accounting after step {steps}: " in out and f" {trained} trained, 0 dropped" in out
    new_pid = _generator_pid(run_dir)
    assert new_pid is not None and new_pid != killer.killed[0]  # placement.json names the restarted process


def test_a_sync_run_restarts_its_generator_then_ends_with_one_line_once_the_restarts_are_used_up(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
):
    run_dir = tmp_path / "run"

    def when(run_dir: Path, killed: list[int]) -> bool:
        # First after step 1; then, once the restarted generator has served a step, that one too.
        if not killed:
            return _completed_steps(run_dir) >= 1
        metrics = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
        return metrics[-1].get("generation/restarts") == 1.0

    killer = Killer(run_dir, when, times=2)
    try:
        status = main(
            [
                "train",
                DEMO,
                "--run-dir",
                str(run_dir),
                *SHORT_DEMO,
                "ppo.async_ppo.enabled=false",
                "ppo.max_num_steps=40",
                "generation.max_restarts=1",
            ]
        )
    finally:
        killer.stop()
    out, err = capsys.readouterr()
    assert len(killer.killed) == 2, (out + err)[-3000:]
    assert status == 1, (out + err)[-3000:]
    restarts = RESTART_LINE.findall(out)
    assert len(restarts) == 1 and int(restarts[0][0]) == killer.killed[0] and restarts[0][2] == "1", out[-3000:]
    metrics = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert metrics[-1]["generation/restarts"] == 1.0 and metrics[-1]["step"] < 40  # trained on after the restart
    # One line, naming the generator, its process, the step and the cause; no traceback or Ray paragraph.
    assert not [noise for noise in NOISE if noise in out + err], (out + err)[-3000:]
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and err.endswith(errors[0] + "\n"), err[-3000:]  # the last line, the only error
    assert re.fullmatch(
        rf"error: the generator worker \(rank 0, pid {killer.killed[1]}\) died during step \d+: its process ended "
        r"unexpectedly[^;]*; all generation\.max_restarts=1 restarts are used up; the run stops; rerun the same "
        r"command to resume from its last checkpoint",
        errors[0],
    ), errors[0]


@pytest.mark.parametrize(
    ("role", "overrides", "outcome"),
    [
        ("generator", ["generation.max_restarts=0"], "generation.max_restarts=0: generators are not restarted; "),
        ("policy", [], ""),  # a trainer rank is never restarted
    ],
)
def test_a_death_that_ends_the_run_is_one_line_naming_role_rank_and_step_and_exit_status_1(
    role: str, overrides: list[str], outcome: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
):
    run_dir = tmp_path / "run"
    killed: list[int] = []

    def kill_after_step_1() -> None:
        deadline = time.monotonic() + 300
        while _completed_steps(run_dir) < 1 and time.monotonic() < deadline:
            time.sleep(0.05)
        records = json.loads((run_dir / "placement.json").read_text())
        killed.append(next(record["pid"] for record in records if record["role"] == role))
        os.kill(killed[0], signal.SIGKILL)

    killer = threading.Thread(target=kill_after_step_1, daemon=True)
    killer.start()
    status = main(["train", DEMO, "--run-dir", str(run_dir), *SHORT_DEMO, "ppo.max_num_steps=40", *overrides])
    killer.join(timeout=5)
    out, err = capsys.readouterr()
    assert status == 1 and killed, (out + err)[-3000:]
    assert not RESTART_LINE.search(out), out[-3000:]
    assert not [noise for noise in NOISE if noise in out + err], (out + err)[-3000:]
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and err.endswith(errors[0] + "\n"), err[-3000:]
    assert re.fullmatch(
        rf"error: the {role} worker \(rank 0, pid {killed[0]}\) died during step \d+: its process ended "
        rf"unexpectedly[^;]*; {re.escape(outcome)}the run stops; rerun the same command to resume from its last "
        r"checkpoint",
        errors[0],
    ), errors[0]
