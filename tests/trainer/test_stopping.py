"""SignalStop: SIGTERM and SIGINT take the same path (a stop request, then an interrupt, then exit), each reported
with its own exit status; the end-to-end stop of a real run is tests/integration/test_async_training.py (SIGINT)."""

import os
import signal

import pytest

from asyncppo.trainer.stopping import SignalStop


@pytest.mark.parametrize(
    ("signum", "status", "name"), [(signal.SIGTERM, 143, "SIGTERM"), (signal.SIGINT, 130, "SIGINT")]
)
def test_a_delivered_signal_requests_a_stop_with_its_exit_status_and_a_second_interrupts(
    signum: signal.Signals, status: int, name: str
) -> None:
    stop = SignalStop()
    before = signal.getsignal(signum)
    with stop.installed():
        assert not stop.requested()
        os.kill(os.getpid(), signum)  # the handler runs before the next bytecode of this thread
        assert stop.requested() and stop.exit_status == status and stop.name == name
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signum)
    assert signal.getsignal(signum) is before  # the previous handler is back
