"""`asyncppo train CONFIG [key=value ...] [--run-dir DIR]`: build the run, train it, close it.

The run and its driver loop live in `trainer/` (`trainer/run.py`, `trainer/loop.py`); this is the command.
"""

import argparse
from pathlib import Path

from asyncppo.config import load_config
from asyncppo.trainer.build import build_run
from asyncppo.trainer.loop import train


def run_train_command(args: argparse.Namespace) -> int:
    """Train with the given config; the run directory gets config, metrics, checkpoints, plots, TensorBoard."""
    config = load_config(args.config, args.overrides)
    run_dir = Path(args.run_dir or config.logger.log_dir)
    run = build_run(config, run_dir)
    try:
        train(run)
    finally:
        run.close()
    print(f"run directory: {run_dir}", flush=True)
    return 0
