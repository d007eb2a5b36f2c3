"""A training run that stops cleanly on SIGTERM and SIGINT (Ctrl-C), for `asyncppo train` and `asyncppo.train`.

1st signal --> the loop finishes the step in progress, checkpoints it, returns --> close, Ray down, exit 128+N
2nd signal --> the step in progress (or the checkpoint write) is abandoned     --> close, Ray down, exit 128+N
3rd signal --> the process ends at once

Ray goes down at the end only when the run started it: a cluster the caller had joined (a notebook's, a test
session's) stays up for its next run.
"""

import contextlib
import os
import signal
from collections.abc import Generator
from dataclasses import dataclass
from pathlib import Path
from types import FrameType

import ray

from asyncppo.trainer.build import start_run
from asyncppo.trainer.loop import train
from asyncppo.trainer.run import Run
from asyncppo.trainer.setup import RunSetup
from asyncppo.workers.ray_host import shutdown_ray

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


class SignalStop:
    """Records SIGTERM / SIGINT; the first only sets the stop request that the loop reads between steps."""

    def __init__(self) -> None:
        self.received: list[int] = []

    def requested(self) -> bool:
        return bool(self.received)

    @property
    def exit_status(self) -> int:
        """128 + the first signal's number, as a shell reports a process ended by it (143 SIGTERM, 130 SIGINT)."""
        return 128 + self.received[0]

    @property
    def name(self) -> str:
        return signal.Signals(self.received[0]).name

    def handle(self, signum: int, _: FrameType | None) -> None:
        self.received.append(signum)
        if len(self.received) == 2:
            # KeyboardInterrupt, not an exception of our own: inside a blocking Ray call (ray.get) Ray turns only
            # this one into an interrupt of the call; any other exception raised by a handler there is lost.
            raise KeyboardInterrupt
        if len(self.received) > 2:
            os._exit(self.exit_status)  # the stop itself hangs: Ray's daemons end with their parent

    @contextlib.contextmanager
    def installed(self) -> Generator[None]:
        """Handle the signals while the block runs; the previous handlers come back after it."""
        previous = {signum: signal.signal(signum, self.handle) for signum in STOP_SIGNALS}
        try:
            yield
        finally:
            for signum, handler in previous.items():
                signal.signal(signum, handler)


@dataclass(frozen=True)
class RunOutcome:
    """How a run ended: the exit status for the shell, and the line to print when a signal stopped it."""

    exit_status: int
    stopped_line: str | None


def train_until_done_or_stopped(setup: RunSetup, run_dir: Path) -> RunOutcome:
    """Start, train and close the run, with SIGTERM / SIGINT handled as the module docstring says."""
    ray_was_up = ray.is_initialized()
    stop = SignalStop()
    run: Run | None = None
    completed: int | None = None
    with stop.installed():
        try:
            try:
                run = start_run(setup, run_dir)  # starts Ray after our handlers; init_local_ray puts ours back
                try:
                    completed = train(run, stop_requested=stop.requested)
                finally:
                    # Worker processes outlive the run only where Ray does (a cluster this process had joined).
                    run.close(keep_workers=ray_was_up and completed is not None)
            finally:
                if not ray_was_up:
                    shutdown_ray()
        except KeyboardInterrupt:  # only our handler raises it (the second signal): anything else propagates
            if len(stop.received) < 2:
                raise
            if not ray_was_up:
                shutdown_ray()  # a no-op unless the second signal cut the first shutdown short
    if not stop.requested():
        return RunOutcome(0, None)
    return RunOutcome(stop.exit_status, _stopped_line(stop, run, completed))


def _stopped_line(stop: SignalStop, run: Run | None, completed: int | None) -> str:
    """One line: which signal stopped the run, after which step, and the checkpoint to resume from."""
    if run is None:
        return f"stopped by {stop.name} while the run was starting: nothing trained"
    latest = run.checkpoints.latest()
    checkpoint = f"checkpoint {latest}" if latest is not None else "no checkpoint"
    if completed is None:
        return f"stopped by {stop.name} (again: the step in progress was abandoned): last {checkpoint}"
    if not run.schedule.checkpoints:
        checkpoint = "no checkpoint (checkpointing.enabled is false)"
    return f"stopped by {stop.name} after step {completed}: {checkpoint}"
