"""Where async PPO's time goes: the collector's TimeTally and the driver's idle breakdown of each step.

collector loop waits / failed rollouts --TimeTally.add--> AsyncBatchSource reads take() per batch:
    async/idle/refit_event_wait, async/idle/generation_limit_pause, async/idle/buffer_full_backoff,
    async/idle/generator_restart, async/wasted/failed_trajectory
driver loop: step timings --driver_idle_breakdown--> async/idle/refit_bubble, async/idle/validation,
    async/efficiency (async/idle/buffer_starvation comes with the batch)
"""

import threading
from collections.abc import Iterable, Mapping

# Why the collector's loop may start no rollout: a weight update is in progress (the collector is paused); every
# target the staleness window allows is covered, or max_concurrent_groups rollouts already run; the buffer has no
# free slot (backpressure at reservation); a generator process died and is being restarted.
REFIT_EVENT_WAIT = "idle/refit_event_wait"
GENERATION_LIMIT_PAUSE = "idle/generation_limit_pause"
BUFFER_FULL_BACKOFF = "idle/buffer_full_backoff"
GENERATOR_RESTART_WAIT = "idle/generator_restart"
FAILED_TRAJECTORY = "wasted/failed_trajectory"
"""Rollout seconds (summed over concurrent rollouts, so it can exceed wall time) spent on groups that failed."""
COLLECTOR_TIME_REASONS = (
    REFIT_EVENT_WAIT,
    GENERATION_LIMIT_PAUSE,
    BUFFER_FULL_BACKOFF,
    GENERATOR_RESTART_WAIT,
    FAILED_TRAJECTORY,
)
BUFFER_STARVATION = "async/idle/buffer_starvation"
"""The driver's wait for a complete batch (AsyncBatchSource.next_batch)."""


class TimeTally:
    """A thread-safe sum of seconds per reason; `take()` returns the sums since the previous take."""

    def __init__(self, reasons: Iterable[str]) -> None:
        self.reasons = tuple(reasons)
        if not self.reasons:
            raise ValueError("a TimeTally needs at least one reason")
        self._lock = threading.Lock()
        self._seconds = dict.fromkeys(self.reasons, 0.0)

    def add(self, reason: str, seconds: float) -> None:
        if reason not in self._seconds:
            raise ValueError(f"unknown time reason {reason!r}; expected one of {self.reasons}")
        if seconds < 0:
            raise ValueError(f"seconds for {reason!r} must be >= 0, got {seconds}")
        with self._lock:
            self._seconds[reason] += seconds

    def take(self) -> dict[str, float]:
        """Every reason's seconds since the last take (0.0 when none, so each series exists every step)."""
        with self._lock:
            taken, self._seconds = self._seconds, dict.fromkeys(self.reasons, 0.0)
        return taken


def driver_idle_breakdown(step_metrics: Mapping[str, float]) -> dict[str, float]:
    """The driver's idle seconds of one async step under their async/ names, and the fraction it computed.

    Derived from the step's timings, not measured again:
        async/idle/refit_bubble = timing/sync_bubble  (rollouts drain or pause, weights are pushed)
        async/idle/validation   = timing/validation   (0 on steps without validation)
        async/efficiency = 1 - (async/idle/buffer_starvation + refit_bubble + validation) / timing/step
    i.e. the share of the step's wall time spent training rather than waiting. {} for a sync step (no
    async/idle/buffer_starvation): its generation is work, not idle time.
    """
    if BUFFER_STARVATION not in step_metrics:
        return {}
    refit_bubble = step_metrics.get("timing/sync_bubble", 0.0)
    validation = step_metrics.get("timing/validation", 0.0)
    idle = step_metrics[BUFFER_STARVATION] + refit_bubble + validation
    step_seconds = step_metrics["timing/step"]
    return {
        "async/idle/refit_bubble": refit_bubble,
        "async/idle/validation": validation,
        "async/efficiency": max(0.0, 1.0 - idle / step_seconds) if step_seconds > 0 else 0.0,
    }
