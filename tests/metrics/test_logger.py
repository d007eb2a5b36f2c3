"""MetricsLogger: required sinks raise, best-effort sinks are disabled loudly and the local record goes on."""

import logging

import pytest

from asyncppo.metrics import MetricsLogger


class RecordingSink:
    def __init__(self) -> None:
        self.logged: list[tuple[int, dict[str, float]]] = []
        self.closed = False

    def log(self, step, metrics):
        self.logged.append((step, dict(metrics)))

    def close(self):
        self.closed = True


class RecordingImageSink(RecordingSink):
    def __init__(self) -> None:
        super().__init__()
        self.images: list[tuple[int, str, str]] = []

    def log_image(self, step, key, path):
        self.images.append((step, key, str(path)))


class FailingSink(RecordingImageSink):
    """Fails from step `fail_from` on, like a remote service that goes away mid-run."""

    def __init__(self, fail_from: int = 0) -> None:
        super().__init__()
        self.fail_from = fail_from

    def log(self, step, metrics):
        if step >= self.fail_from:
            raise ConnectionError("service unreachable")
        super().log(step, metrics)

    def log_image(self, step, key, path):
        raise ConnectionError("service unreachable")

    def close(self):
        raise ConnectionError("service unreachable")


def test_every_sink_gets_every_step():
    first, second = RecordingSink(), RecordingSink()
    logger = MetricsLogger([first], best_effort_sinks=[second])
    logger.log(1, {"train/loss": 0.5})
    logger.log(2, {"train/loss": 0.25})
    assert first.logged == second.logged == [(1, {"train/loss": 0.5}), (2, {"train/loss": 0.25})]


def test_a_failing_required_sink_raises():
    logger = MetricsLogger([FailingSink()])
    with pytest.raises(ConnectionError):
        logger.log(1, {"x": 1.0})


def test_a_failing_best_effort_sink_is_disabled_loudly_and_local_logging_goes_on(caplog):
    local, remote = RecordingSink(), FailingSink(fail_from=2)
    logger = MetricsLogger([local], best_effort_sinks=[remote])
    with caplog.at_level(logging.ERROR, logger="asyncppo.metrics.logger"):
        for step in range(1, 5):
            logger.log(step, {"x": float(step)})
    assert [step for step, _ in local.logged] == [1, 2, 3, 4]
    assert [step for step, _ in remote.logged] == [1]
    assert logger.disabled_sinks == [remote]
    (record,) = caplog.records  # once, not once per step
    assert "FailingSink FAILED (log at step 2: service unreachable)" in record.getMessage()
    assert "DISABLED" in record.getMessage()
    assert record.exc_info is not None


def test_images_go_only_to_sinks_that_take_them():
    plain, images, remote = RecordingSink(), RecordingImageSink(), FailingSink(fail_from=100)
    logger = MetricsLogger([plain, images], best_effort_sinks=[remote])
    logger.log_image(3, "mismatch/plot", "plot.png")
    assert images.images == [(3, "mismatch/plot", "plot.png")]
    assert logger.disabled_sinks == [remote]


def test_close_closes_every_sink_before_raising_a_required_sinks_error():
    failing, after = FailingSink(), RecordingSink()
    logger = MetricsLogger([failing, after], best_effort_sinks=[RecordingSink()])
    with pytest.raises(ConnectionError):
        logger.close()
    assert after.closed
    assert logger.best_effort_sinks[0].closed  # pyright: ignore[reportAttributeAccessIssue]  # a RecordingSink
