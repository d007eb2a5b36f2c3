"""`asyncppo report RUN_DIR [RUN_DIR_B] [-o PATH]`: write the run report (HTML) and print its path.

The page itself is built in `metrics/report.py`; `asyncppo train` also writes it into the run directory when the
run ends (`write_report_or_warn` there), where a failure is a warning that leaves the run's exit status alone.
"""

import argparse
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
