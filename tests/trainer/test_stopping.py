"""SignalStop: SIGTERM and SIGINT take the same path, each reported with its own exit status: while the run starts
every signal interrupts it; once it trains a stop request comes first, then an interrupt, then exit. The end-to-end
stops of real runs are tests/integration/test_async_training.py (SIGINT while training) and
tests/cli/test_signals_at_start.py (SIGTERM and SIGINT while the run starts)."""

import os
import signal

import pytest

from asyncppo.trainer.stop_signals import SignalStop

SIGNALS = [(signal.SIGTERM, 143, "SIGTERM"), (signal.SIGINT, 130, "SIGINT")]


@pytest.mark.parametrize(("signum", "status", "name"), SIGNALS)
def test_while_training_a_signal_requests_a_stop_with_its_exit_status_and_a_second_interrupts(
    signum: signal.Signals, status: int, name: str
) -> None:
    stop = SignalStop()
    stop.training = True
    before = signal.getsignal(signum)
    with stop.installed():
        assert not stop.requested()
        os.kill(os.getpid(), signum)  # the handler runs before the next bytecode of this thread
        assert stop.requested() and stop.exit_status == status and stop.name == name
        with pytest.raises(KeyboardInterrupt) as raised:
            os.kill(os.getpid(), signum)
        assert stop.ended(raised.value)
    assert signal.getsignal(signum) is before  # the previous handler is back


@pytest.mark.parametrize(("signum", "status", "name"), SIGNALS)
def test_while_the_run_starts_the_first_signal_interrupts_and_names_itself_in_one_line(
    signum: signal.Signals, status: int, name: str
) -> None:
    stop = SignalStop()
    with stop.installed(), pytest.raises(KeyboardInterrupt) as raised:
        os.kill(os.getpid(), signum)
    assert stop.ended(raised.value) and stop.exit_status == status
    assert stop.interrupted_start_line() == f"stopped by {name} while the run was starting: nothing trained"


def test_an_error_a_library_made_of_the_interrupt_is_the_stop_and_other_errors_are_not() -> None:
    stop = SignalStop()
    with stop.installed():
        try:
            try:
                os.kill(os.getpid(), signal.SIGTERM)
            except KeyboardInterrupt as interrupt:
                raise RuntimeError("worker start failed") from interrupt
        except RuntimeError as wrapped:
            assert stop.ended(wrapped)
    assert not stop.ended(RuntimeError("a failure of its own"))
    assert not SignalStop().ended(KeyboardInterrupt())  # one the handler did not raise
