"""The `asyncppo` program's exit status after a signal stop does not depend on the interpreter's teardown.

CPython remembers a KeyboardInterrupt that went through a nested PyRun_* call (as native code of torch or Ray can
run one while our stop handler's interrupt passes) and, under `python -m`, ends the process by SIGINT after its
teardown whatever exit status it was given (on Python 3.11, ending this program with `sys.exit(cli.main())`
instead gives status -2). `run_as_program` ends a stopped run before that teardown.
"""

import subprocess
import sys
from pathlib import Path

import pytest

PROGRAM = """
import ctypes
import asyncppo.cli.main as cli

def stopped_run():
    # An interrupt through a nested PyRun call, as one passing through a library's native code leaves it.
    ctypes.pythonapi.PyRun_SimpleString(b"raise KeyboardInterrupt")
    print("stopped by SIGTERM while the run was starting: nothing trained", flush=True)
    return {status}

cli.main = stopped_run
{ending}
"""


def _run_module(tmp_path: Path, status: int, ending: str) -> subprocess.CompletedProcess[str]:
    (tmp_path / "stopped_program.py").write_text(PROGRAM.format(status=status, ending=ending))
    return subprocess.run(
        [sys.executable, "-m", "stopped_program"], cwd=tmp_path, capture_output=True, text=True, timeout=60, check=False
    )


@pytest.mark.parametrize("status", [143, 130])
def test_a_stopped_run_exits_with_its_status_even_after_an_interrupt_through_native_code(tmp_path: Path, status: int):
    finished = _run_module(tmp_path, status, "cli.run_as_program()")
    assert finished.returncode == status, finished.stderr
    assert finished.stdout.splitlines() == ["stopped by SIGTERM while the run was starting: nothing trained"]
