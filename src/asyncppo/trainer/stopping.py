"""A training run that stops cleanly on SIGTERM and SIGINT (Ctrl-C), for `asyncppo train` and `asyncppo.train`.

The caller installs a `SignalStop` (`trainer/stop_signals.py`) before anything else; here the run starts under it,
and once its loop begins a signal asks for a clean stop instead of interrupting:

start (Ray, workers)  --signal--> interrupted: what started ends            --> Ray down, exit 128+N
loop, 1st signal      --> the step in progress finishes and is checkpointed  --> close, Ray down, exit 128+N
loop, 2nd signal      --> the step in progress (or the checkpoint write) is abandoned --> close, Ray down, exit 128+N
3rd signal            --> the process ends at once

Ray goes down at the end only when the run started it: a cluster the caller had joined (a notebook's, a test
session's) stays up for its next run.
"""

from dataclasses import dataclass
from pathlib import Path

import ray

from asyncppo.trainer.build import start_run
from asyncppo.trainer.loop import train
from asyncppo.trainer.run import Run
from asyncppo.trainer.setup import RunSetup
from asyncppo.trainer.stop_signals import SignalStop
from asyncppo.workers.ray_cluster import shutdown_ray


@dataclass(frozen=True)
class RunOutcome:
    """How a run ended: the exit status for the shell, and the line to print when a signal stopped it."""

    exit_status: int
    stopped_line: str | None


def train_until_done_or_stopped(
    setup: RunSetup, run_dir: Path, stop: SignalStop, resume_from: str | None = None
) -> RunOutcome:
    """Start, train and close the run (from `resume_from`, a checkpoint chosen by hand, when given), with SIGTERM /
    SIGINT answered as the module docstring says; `stop` must be installed."""
    ray_was_up = ray.is_initialized()
    run: Run | None = None
    completed: int | None = None
    try:
        try:
            run = start_run(setup, run_dir, resume_from)  # init_local_ray keeps our handlers through Ray's start
            try:
                stop.training = True  # from here a first signal lets the step in progress finish and checkpoint
                completed = train(run, stop_requested=stop.requested)
            finally:
                # Worker processes outlive the run only where Ray does (a cluster this process had joined).
                run.close(keep_workers=ray_was_up and completed is not None)
        finally:
            if not ray_was_up:
                shutdown_ray()
    except BaseException as error:
        if not stop.ended(error):  # only our handler's interrupt is a stop: anything else propagates
            raise
        if not ray_was_up:
            shutdown_ray()  # a no-op unless a signal cut the first shutdown short
    if not stop.requested():
        return RunOutcome(0, None)
    return RunOutcome(stop.exit_status, _stopped_line(stop, run, completed))


def _stopped_line(stop: SignalStop, run: Run | None, completed: int | None) -> str:
    """One line: which signal stopped the run, after which step, and the checkpoint to resume from."""
    if run is None or not stop.training:
        return stop.interrupted_start_line()
    latest = run.checkpoints.latest()
    checkpoint = f"checkpoint {latest}" if latest is not None else "no checkpoint"
    if completed is None:
        return f"stopped by {stop.name} (again: the step in progress was abandoned): last {checkpoint}"
    if not run.schedule.checkpoints:
        checkpoint = "no checkpoint (checkpointing.enabled is false)"
    return f"stopped by {stop.name} after step {completed}: {checkpoint}"
