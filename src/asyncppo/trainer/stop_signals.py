"""SignalStop: what SIGTERM and SIGINT (Ctrl-C) do to `asyncppo train`, from its first moment to its last line.

`asyncppo.train` installs it before anything else (this module imports nothing heavy, so the handlers are in place
while the config loads and torch, transformers and Ray import); `trainer/stopping.py` tells it when training begins:

    starting (config, imports, Ray, worker builds)   every signal interrupts: nothing is trained, nothing to save
    training (the loop has begun)                     1st: finish the step in progress, checkpoint it, stop
                                                      2nd: abandon the step in progress (or the checkpoint write)
    always                                            3rd: the process ends at once

An interrupt is a KeyboardInterrupt, not an exception of our own: inside a blocking Ray call (ray.get) Ray turns
only this one into an interrupt of the call, and any other exception raised by a handler there is lost. The run
ends with exit status 128 + the first signal's number (143 SIGTERM, 130 SIGINT) and one line saying so.
"""

import contextlib
import os
import signal
from collections.abc import Generator
from types import FrameType

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


class SignalStop:
    """Records SIGTERM / SIGINT and answers them as the module docstring says."""

    def __init__(self) -> None:
        self.received: list[int] = []
        self.training = False
        """False while the run starts (a signal interrupts it); True once the loop runs (the first one asks it to
        stop after the step in progress)."""
        self.interrupted = False
        """Whether the handler has raised a KeyboardInterrupt."""

    def requested(self) -> bool:
        return bool(self.received)

    @property
    def exit_status(self) -> int:
        """128 + the first signal's number, as a shell reports a process ended by it (143 SIGTERM, 130 SIGINT)."""
        return 128 + self.received[0]

    @property
    def name(self) -> str:
        return signal.Signals(self.received[0]).name

    def interrupted_start_line(self) -> str:
        """The one line of a run that a signal stopped before it trained."""
        return f"stopped by {self.name} while the run was starting: nothing trained"

    def handle(self, signum: int, _: FrameType | None) -> None:
        self.received.append(signum)
        if len(self.received) > 2:
            os._exit(self.exit_status)  # the stop itself hangs: Ray's daemons end with their parent
        if len(self.received) == 2 or not self.training:
            self.interrupted = True
            raise KeyboardInterrupt

    def ended(self, error: BaseException) -> bool:
        """Whether `error`, caught on its way out of the run, is this handler's interrupt: the KeyboardInterrupt it
        raised, or an error some library made of it on the way (it is then in the error's chain of causes)."""
        seen: set[int] = set()
        cause: BaseException | None = error
        while cause is not None and id(cause) not in seen:
            if isinstance(cause, KeyboardInterrupt):
                return self.interrupted
            seen.add(id(cause))
            cause = cause.__cause__ or cause.__context__
        return False

    @contextlib.contextmanager
    def installed(self) -> Generator[None]:
        """Handle the signals while the block runs; the previous handlers come back after it."""
        previous = {signum: signal.signal(signum, self.handle) for signum in STOP_SIGNALS}
        try:
            yield
        finally:
            for signum, handler in previous.items():
                signal.signal(signum, handler)
