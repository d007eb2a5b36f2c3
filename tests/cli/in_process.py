"""`asyncppo ARGS` run in this test process (a process start costs ~8 s), from the repository root."""

import contextlib
import io
from dataclasses import dataclass
from pathlib import Path

from asyncppo.cli.main import main

REPO = Path(__file__).parents[2]


@dataclass(frozen=True)
class Result:
    returncode: int
    stdout: str
    stderr: str


def run_asyncppo(*args: str) -> Result:
    """`asyncppo ARGS` in this process, from the repository root: its exit status and what it printed."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.chdir(REPO), contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        status = main(list(args))
    return Result(status, out.getvalue(), err.getvalue())
