"""`asyncppo train CONFIG [key=value ...] [--run-dir DIR] [--resume-from CHECKPOINT]`: `asyncppo.train` (api.py)
behind a command line.

The API loads the config (a NeMo-RL PPO or GRPO config is ported in memory, as `asyncppo config port` does, and
its table printed) and runs the pre-flight before torch, transformers or Ray are imported, then trains and writes
the run report (`asyncppo report`) into the run directory. The run, its driver loop and its clean stop on SIGTERM /
SIGINT (from the command's first moment: `trainer/stop_signals.py`, `trainer/stopping.py`) live in `trainer/`. This
command prints the last lines and returns the exit status (143 / 130 when a signal stopped the run, one line naming
it); a ConfigError (a `--resume-from` checkpoint that is missing or fails verification too) becomes exit 2 in
cli/main.py.
"""

import argparse

from asyncppo.api import train


def run_train_command(args: argparse.Namespace) -> int:
    """Train with the given config; the run directory gets config, metrics, checkpoints, plots, TensorBoard and
    the run report (report.html)."""
    # The config's directory is searched for `env.reward_function: module:function` (with the working directory),
    # so a reward module beside the config imports without PYTHONPATH.
    result = train(args.config, overrides=args.overrides, run_dir=args.run_dir, resume_from=args.resume_from)
    print(result.stopped or f"run directory: {result.run_dir}", flush=True)
    if result.report is not None:
        print(f"report: {result.report}", flush=True)
    return result.exit_status
