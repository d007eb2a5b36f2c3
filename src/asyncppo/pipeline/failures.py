"""The per-step failure budget of prompt groups: failed rollouts are dropped and replaced until it runs out.

Both batch sources use it. A group whose rollout failed (after the rollout's own retries) is dropped, counted,
and a fresh prompt takes its place; only when more groups fail while one step is being filled than the budget
allows does the run stop, with a StepFillError naming the step, the count and the last failure.

    sync:  next_batch(step): reset -> rollouts -> failures recorded -> refill ... -> StepFillError past budget
    async: collector records each failure; next_batch(step) resets once step's batch has been handed over
"""

import logging
import threading

from asyncppo.pipeline.errors import StepFillError, step_number

log = logging.getLogger(__name__)


class StepFailureBudget:
    """Counts failed prompt groups since the last reset (thread-safe); `budget_key` names the setting in errors."""

    def __init__(self, max_failures: int, budget_key: str) -> None:
        if max_failures < 0:
            raise ValueError(f"{budget_key} must be >= 0, got {max_failures}")
        self.max_failures = max_failures
        self.budget_key = budget_key
        self._lock = threading.Lock()
        self._count = 0
        self._total = 0

    @property
    def count(self) -> int:
        """Failures since the last reset."""
        with self._lock:
            return self._count

    @property
    def remaining(self) -> int:
        """Failures the step being filled may still absorb (0: the next one stops the run)."""
        with self._lock:
            return max(0, self.max_failures - self._count)

    @property
    def total(self) -> int:
        """Failures over the life of this budget (the run since its start or resume)."""
        with self._lock:
            return self._total

    def reset(self) -> None:
        """A step's batch was handed over: the next step starts with the whole budget."""
        with self._lock:
            self._count = 0

    def record(self, step: int, group_id: int, error: BaseException) -> StepFillError | None:
        """Count one failed group of step index `step`; returns (does not raise) the StepFillError once the budget is
        exceeded. Messages number the step from 1 (`step_number`).

        Returning lets the async collector put the error on its failure channel while the sync source raises it.
        """
        with self._lock:
            self._count += 1
            self._total += 1
            count = self._count
        if count <= self.max_failures:
            log.warning(
                "step %d: prompt group %d failed and is replaced (%d of %s=%d): %s: %s",
                step_number(step),
                group_id,
                count,
                self.budget_key,
                self.max_failures,
                type(error).__name__,
                error,
            )
            return None
        failure = StepFillError(
            f"step {step_number(step)} could not be filled: {count} prompt {'group' if count == 1 else 'groups'} "
            f"failed while filling it, more than {self.budget_key}={self.max_failures}; last failure (group "
            f"{group_id}): {type(error).__name__}: {error}"
        )
        failure.__cause__ = error
        return failure
