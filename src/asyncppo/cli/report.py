"""`asyncppo report RUN_DIR [RUN_DIR_B] [-o PATH]`: write the run report (HTML) and print its path.

The page itself is built in `metrics/report.py`; `asyncppo train` also writes it into the run directory when the
run ends (`write_report_after_training`), where a failure is a warning that leaves the run's exit status alone.
"""

import argparse
import sys
from pathlib import Path

from asyncppo.config import ConfigError
from asyncppo.metrics.report import write_report


def run_report_command(args: argparse.Namespace) -> int:
    """Write the report of `args.run_dirs` (one or two) to `args.output` or the default path; print the path."""
    run_dirs = [Path(path) for path in args.run_dirs]
    if len(run_dirs) > 2:
        raise ConfigError([f"report: got {len(run_dirs)} run directories; expected one, or two to compare"])
    path = write_report(run_dirs, Path(args.output) if args.output else None)
    print(path, flush=True)
    return 0


def write_report_after_training(run_dir: Path) -> None:
    """The report of a run that just ended; any failure is printed as one warning line and otherwise ignored,
    because the run's own outcome (its exit status and last line) is what the caller reports."""
    try:
        path = write_report([run_dir])
    except (Exception, KeyboardInterrupt) as error:  # a report must never mask the run's outcome
        reason = "interrupted" if isinstance(error, KeyboardInterrupt) else f"{type(error).__name__}: {error}"
        print(f"warning: run report not written: {reason}", file=sys.stderr, flush=True)
        return
    print(f"report: {path}", flush=True)
