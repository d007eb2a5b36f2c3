"""`asyncppo train CONFIG [key=value ...] [--run-dir DIR]`: build the run, train it, close it.

The run, its driver loop and its clean stop on SIGTERM / SIGINT live in `trainer/` (`trainer/stopping.py`);
this is the command: parse (a NeMo-RL PPO config is ported in memory, as `asyncppo config port` does, and its
table printed), train, print one line, write the run report (`asyncppo report`) into the run directory, return
the exit status (143 / 130 when a signal stopped it).
"""

import argparse
from pathlib import Path

from asyncppo.config.nemo_rl.port import load_run_config
from asyncppo.trainer.setup import resolve_setup
from asyncppo.trainer.stopping import train_until_done_or_stopped
from asyncppo.trainer.third_party_output import quiet_third_party_output


def run_train_command(args: argparse.Namespace) -> int:
    """Train with the given config; the run directory gets config, metrics, checkpoints, plots, TensorBoard and
    the run report (report.html)."""
    config = load_run_config(args.config, args.overrides)  # a NeMo-RL config is ported, its table printed
    run_dir = Path(args.run_dir or config.logger.log_dir)
    quiet_third_party_output(config.logger.verbose)
    # The config's directory is searched for `env.reward_function: module:function` (with the working directory),
    # so a reward module beside the config imports without PYTHONPATH.
    setup = resolve_setup(config, Path(args.config).resolve().parent, data=True)
    outcome = train_until_done_or_stopped(setup, run_dir)
    print(outcome.stopped_line or f"run directory: {run_dir}", flush=True)
    # Imported here: the report needs matplotlib, which a run that is only starting has no use for.
    from asyncppo.cli.report import write_report_after_training

    write_report_after_training(run_dir)  # also after a signal stop: the report shows where the run got to
    return outcome.exit_status
