"""MetricsLogger: fans each step's metrics (and images) out to every sink, with an explicit failure rule.

The driver builds one and calls `log(step, metrics)` once per step. The rule:
  * `sinks` (the local record: JSONL, TensorBoard, the console) must work; their errors propagate and stop
    the run, because a run whose metrics are not being recorded is not worth continuing.
  * `best_effort_sinks` (remote services: W&B, MLflow) may fail (network, quota, outage). The first error
    logs a loud ERROR with the traceback and disables that sink for the rest of the run; the local sinks keep
    logging, so nothing is lost. A disabled sink is not retried: retrying would repeat the error (and any
    network timeout) on every step.
With `aliases` (source name -> alias name, see `metrics/aliases.py`) every sink gets each step's metrics also
under the alias names.
"""

import logging
import os
from collections.abc import Mapping, Sequence
from types import TracebackType

from asyncppo.metrics.aliases import with_aliases
from asyncppo.metrics.sinks import ImageSink, MetricsSink

LOGGER = logging.getLogger(__name__)


class MetricsLogger:
    """Sends metrics to required sinks first (so the local record never waits on a remote one), then the rest."""

    def __init__(
        self,
        sinks: Sequence[MetricsSink],
        best_effort_sinks: Sequence[MetricsSink] = (),
        aliases: Mapping[str, str] | None = None,
    ) -> None:
        self.sinks = list(sinks)
        self.best_effort_sinks = list(best_effort_sinks)
        self.disabled_sinks: list[MetricsSink] = []
        self.aliases = dict(aliases or {})

    def log(self, step: int, metrics: Mapping[str, float]) -> None:
        metrics = with_aliases(metrics, self.aliases)
        for sink in self.sinks:
            sink.log(step, metrics)
        for sink in self._active_best_effort():
            try:
                sink.log(step, metrics)
            except Exception as error:  # any failure of a remote service; see the module docstring
                self._disable(sink, f"log at step {step}", error)

    def log_image(self, step: int, key: str, path: str | os.PathLike[str]) -> None:
        """Store an image file with the sinks that take images (the others skip it)."""
        for sink in self.sinks:
            if isinstance(sink, ImageSink):
                sink.log_image(step, key, path)
        for sink in self._active_best_effort():
            if isinstance(sink, ImageSink):
                try:
                    sink.log_image(step, key, path)
                except Exception as error:  # as in log()
                    self._disable(sink, f"log_image {key!r} at step {step}", error)

    def close(self) -> None:
        """Close every sink; the first error of a required sink is raised after all of them were closed."""
        first_error: BaseException | None = None
        for sink in self.sinks:
            try:
                sink.close()
            except Exception as error:  # re-raised below, after the other sinks had their chance to flush
                first_error = first_error or error
        for sink in self._active_best_effort():
            try:
                sink.close()
            except Exception as error:  # as in log()
                self._disable(sink, "close", error)
        if first_error is not None:
            raise first_error

    def __enter__(self) -> "MetricsLogger":
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, traceback: TracebackType | None
    ) -> None:
        self.close()

    def _active_best_effort(self) -> list[MetricsSink]:
        return [sink for sink in self.best_effort_sinks if sink not in self.disabled_sinks]

    def _disable(self, sink: MetricsSink, action: str, error: Exception) -> None:
        self.disabled_sinks.append(sink)
        LOGGER.error(
            "METRICS SINK %s FAILED (%s: %s) and is DISABLED for the rest of this run; "
            "the local sinks keep logging every metric.",
            type(sink).__name__,
            action,
            error,
            exc_info=error,
        )
