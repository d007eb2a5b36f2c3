"""The chaos harness's short version (scripts/chaos.py --cycles 5): one each of a whole-run SIGKILL, a SIGKILL
inside a checkpoint write, a generator SIGKILL the run must survive, a signal during start-up and one during
training, then a last start to the end and the book checks (docs/reliability.md has the 100-cycle table).

It runs the script as a user would, in its own process sessions, and asserts on its exit status and table: a
failing check, a hang or a traceback on the run's console makes the script exit 1 with a `FAIL` line.
"""

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.slow]
REPO = Path(__file__).parents[2]


def test_five_chaos_cycles_lose_nothing_and_survive_a_generator_kill(tmp_path: Path):
    out = tmp_path / "chaos"
    finished = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "chaos.py"), "--cycles", "5", "--final-steps", "2", "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=540,
        check=False,
    )
    report = finished.stdout + finished.stderr
    assert finished.returncode == 0, report + (out / "console.log").read_text(errors="replace")[-6000:]
    for action in ("run-kill", "checkpoint", "generator", "signal-start", "signal-train"):
        assert f"| {action} | 1 | 1 |" in report, report
    assert "1 generator restarts seen on the console" in report, report
    assert report.rstrip().endswith("result: 0 failures"), report
