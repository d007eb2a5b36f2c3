"""AsyncBatchSource: the BatchSource of async PPO, taking each step's groups from the collector-fed buffer.

The driver calls next_batch(step), then publishes weights inside `with weight_update(step + 1)`, and saves
state_dict() with the checkpoint.

    Collector --groups (version g, target t)--> TrajectoryBuffer --take(step, sample_max_age(step))--> StepBatch
        ^                                             |
        +-- weight_update(v) exit: window moves       +-- waits also until target step+1 is covered (stored or
                                                          reserved), else publishing v = step+1 strands it

Waiting is bounded: no buffer change for watchdog_timeout_s raises StallError naming the step, the target and
what the buffer and collector hold; a collector failure is raised as CollectorError on the next poll.
"""

import time
from collections.abc import Callable, Generator
from contextlib import contextmanager
from typing import Any

from asyncppo.config.ppo import AsyncPPOConfig
from asyncppo.pipeline.buffer import DROP_REASONS, BufferedGroup, TrajectoryBuffer, default_buffer_size
from asyncppo.pipeline.collector import Collector
from asyncppo.pipeline.errors import StallError, step_number
from asyncppo.pipeline.failures import StepFailureBudget
from asyncppo.pipeline.ledger import AccountingReport
from asyncppo.pipeline.sources import GenerationHealth, GroupRolloutFn, PromptBatches, SourceSnapshot, StepBatch
from asyncppo.pipeline.staleness import AgeSchedule
from asyncppo.pipeline.time_tally import BUFFER_STARVATION

STATE_FORMAT = 1


class AsyncBatchSource:
    """Async PPO's batch source over a Collector and its TrajectoryBuffer (satisfies BatchSource)."""

    def __init__(
        self,
        collector: Collector,
        buffer: TrajectoryBuffer,
        *,
        ages: AgeSchedule,
        drop_incomplete_targets_on_restore: bool,
        watchdog_timeout_s: float,
        clock: Callable[[], float] = time.monotonic,
        poll_interval_s: float = 0.25,
    ) -> None:
        if buffer.max_size < 2 * buffer.num_groups_per_step:
            # Step s's groups and the reservations of step s + 1 must fit together (see next_batch).
            raise ValueError(
                f"buffer max_size {buffer.max_size} must be >= 2 x num_prompts_per_step "
                f"({2 * buffer.num_groups_per_step})"
            )
        if watchdog_timeout_s <= 0:
            raise ValueError(f"watchdog_timeout_s must be > 0, got {watchdog_timeout_s}")
        self._collector = collector
        self._buffer = buffer
        self._ages = ages
        self._drop_incomplete = drop_incomplete_targets_on_restore
        self._watchdog_timeout_s = watchdog_timeout_s
        self._clock = clock
        self._poll_interval_s = poll_interval_s
        self._next_step: int | None = None  # None until the first next_batch
        self._rate_mark: tuple[float, int] = (clock(), 0)

    def start(self) -> None:
        """Start collecting (next_batch does it too); call after load_state_dict when resuming."""
        if self._next_step is None:
            self._next_step = self._collector.initial_version
            self._rate_mark = (self._clock(), self._collector.num_groups_completed)
        self._collector.start()

    def next_batch(self, step: int) -> StepBatch:
        """Step `step`'s N groups, once they are complete AND step + 1 is covered (complete or reserved).

        The second condition prevents a deadlock that resumed async runs otherwise hit, and is applied at every step
        rather than only at startup: after this step the driver publishes version step + 1, whose window starts at
        step + 2, so any group of step + 1 not reserved by then would never get a producer.
        """
        self.start()
        if step != self._next_step:
            raise ValueError(
                f"next_batch({step}): steps must run in order from the collector's initial version "
                f"{self._collector.initial_version}; expected step {self._next_step}"
            )
        if self._collector.version != step:
            raise ValueError(
                f"next_batch({step}) but the generators hold weight version {self._collector.version}: publish "
                f"step {step - 1}'s weights inside weight_update({step}) first"
            )
        started = self._clock()
        groups = self._wait_for(step)
        idle_seconds = self._clock() - started
        self._next_step = step + 1
        trajectories = [trajectory for group in groups for trajectory in group.trajectories]
        metrics = self._metrics(step, groups, idle_seconds)
        metrics["rollout/failed_groups"] = float(self._collector.failed_groups_this_step())
        self._collector.step_filled()
        return StepBatch(trajectories, num_prompts=len(groups), metrics=metrics)

    def _wait_for(self, step: int) -> list[BufferedGroup]:
        max_age = self._ages.sample_max_age(step)
        groups: list[BufferedGroup] | None = None
        revision = self._buffer.revision
        last_progress = self._clock()
        while True:
            self._collector.raise_if_failed()
            if groups is None:
                groups = self._buffer.take(step, max_age)
            if groups is not None and self._buffer.is_covered(step + 1):
                return groups
            waited = self._clock() - last_progress
            if waited >= self._watchdog_timeout_s:
                raise StallError(self._stall_message(step, groups is not None, waited))
            timeout = min(self._poll_interval_s, self._watchdog_timeout_s - waited)
            new_revision = self._buffer.wait_for_change(revision, timeout)
            if new_revision != revision:
                revision, last_progress = new_revision, self._clock()

    def _stall_message(self, step: int, taken: bool, waited: float) -> str:
        if taken:
            awaited = (
                f"target {step + 1} to be covered (stored or reserved: {self._buffer.needed(step + 1)} of "
                f"{self._buffer.num_groups_per_step} groups still unreserved) before this step may train"
            )
        else:
            awaited = (
                f"target {step}: {self._buffer.num_groups_per_step} complete groups generated with version >= "
                f"{step - self._ages.sample_max_age(step)}"
            )
        return (
            # The buffer counts in targets (step indices from 0); the step is named as the progress line names it.
            f"step {step_number(step)} (buffer target {step}): no progress for {waited:.1f} s "
            f"(watchdog_timeout_s={self._watchdog_timeout_s}) waiting for {awaited}; {self._buffer.describe()}; "
            f"{self._collector.describe()}"
        )

    def _metrics(self, step: int, groups: list[BufferedGroup], idle_seconds: float) -> dict[str, float]:
        """Ages are weighted per trajectory and use the version each group started with (its oldest weights).

        Seconds: `async/idle/buffer_starvation` is the driver's wait in this next_batch for a complete batch (and
        for step + 1 to be covered); the collector's `async/idle/*` and `async/wasted/*` (see time_tally) are
        summed since the previous batch.
        """
        versions = [group.generation_version for group in groups for _ in group.trajectories]
        trajectory_ages = [step - version for version in versions]
        policy_ages = [self._ages.policy_age(step, version) for version in versions]
        assert max(policy_ages) <= self._ages.train_age, f"policy ages {policy_ages} exceed the window at {step}"
        now, completed = self._clock(), self._collector.num_groups_completed
        last_time, last_completed = self._rate_mark
        self._rate_mark = (now, completed)
        dropped = self._buffer.dropped_counts()
        metrics = {
            "async/buffer_size": float(self._buffer.size()),
            "async/avg_trajectory_age": sum(trajectory_ages) / len(trajectory_ages),
            "async/max_trajectory_age": float(max(trajectory_ages)),
            "async/avg_policy_age": sum(policy_ages) / len(policy_ages),
            "async/max_policy_age": float(max(policy_ages)),
            BUFFER_STARVATION: idle_seconds,
            "async/failed_trajectories": float(self._collector.num_failed_rollouts),
            # Groups whose generator died under them, run again with the same draw ids (since the run's start).
            "async/rerun_groups": float(self._collector.num_rerun_rollouts),
            "async/collector_groups_per_second": (completed - last_completed) / max(now - last_time, 1e-9),
        }
        metrics.update({f"async/{reason}": seconds for reason, seconds in self._collector.time_tally.take().items()})
        # Cumulative over the run (the ledger is checkpointed), one key per reason so the series never vanish.
        metrics.update({f"async/dropped_prompts/{reason}": float(dropped.get(reason, 0)) for reason in DROP_REASONS})
        return metrics

    @contextmanager
    def weight_update(self, version: int) -> Generator[None]:
        """Entry: stop starting rollouts (and, without in-flight updates, drain them) so the push sees no
        generation. Clean exit: the generators hold `version` (= the step just trained + 1), so the window
        moves and collection resumes. A push that raises leaves the collector paused: the run is ending."""
        self._collector.prepare_for_weight_update()
        yield
        self._collector.set_weight_version(version)
        self._collector.resume_after_weight_update()

    def reseed_generation(self, seed: int) -> None:
        """Left alone: the collector's rollouts interleave with training at timing-dependent points, so a reseed
        would not make them reproducible and would only disturb the engines mid-flight."""
        return None

    def accounting(self) -> AccountingReport:
        """Where every draw id is right now (trained / dropped / buffered / pending), taken atomically."""
        with self._collector.frozen():
            return self._buffer.accounting_report(self._collector.pending_ids(), self._collector.next_draw_id)

    def state_dict(self) -> dict[str, Any]:
        """Collector and buffer state from one instant (the collector is frozen meanwhile); plain data."""
        with self._collector.frozen():
            return {
                "format": STATE_FORMAT,
                "collector": self._collector.state_dict(),
                "buffer": self._buffer.state_dict(),
            }

    def snapshot(self) -> SourceSnapshot:
        """State and books under one freeze: separately, a group completing between the two reads would be pending
        in one and buffered in the other. The freeze is reentrant, so the two reads nest inside it."""
        with self._collector.frozen():
            return SourceSnapshot(state=self.state_dict(), accounting=self.accounting())

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume at the collector's initial version (the step the run restarts at); before the first next_batch."""
        if self._next_step is not None:
            raise RuntimeError("load_state_dict must run before the source starts")
        if state.get("format") != STATE_FORMAT:
            raise ValueError(f"async batch source state has format {state.get('format')}, expected {STATE_FORMAT}")
        self._collector.load_state_dict(state["collector"])
        self._buffer.load_state_dict(
            state["buffer"],
            self._collector.initial_version,
            drop_incomplete_targets=self._drop_incomplete,
            max_age_of_step=self._ages.sample_max_age,
        )

    def close(self) -> None:
        self._collector.stop()


def build_async_source(
    prompts: PromptBatches,
    rollout: GroupRolloutFn,
    settings: AsyncPPOConfig,
    *,
    num_prompts_per_step: int,
    start_step: int,
    policy_training_start_step: int,
    max_concurrent_groups: int | None = None,
    buffer_max_size: int | None = None,
    failure_budget: StepFailureBudget,
    health: GenerationHealth | None = None,
) -> AsyncBatchSource:
    """Buffer + collector + source from the `ppo.async_ppo` section; `start_step` = the step the run starts or
    resumes at, which is also the generators' initial weight version.

    Defaults: the buffer holds the whole window (default_buffer_size) and that many rollouts may run at once.
    `health`: the generators' (see Collector); None where no generator is ever restarted.
    """
    warmup_age = settings.warmup_max_trajectory_age_steps or settings.max_trajectory_age_steps
    ages = AgeSchedule(policy_training_start_step, settings.max_trajectory_age_steps, warmup_age)
    max_size = buffer_max_size or default_buffer_size(num_prompts_per_step, ages.max_age)
    buffer = TrajectoryBuffer(num_prompts_per_step, max_size)
    collector = Collector(
        prompts,
        rollout,
        buffer,
        initial_version=start_step,
        ages=ages,
        max_concurrent_groups=max_concurrent_groups or max_size,
        in_flight_weight_updates=settings.in_flight_weight_updates,
        drain_timeout_s=settings.watchdog_timeout_s,
        failure_budget=failure_budget,
        health=health,
    )
    return AsyncBatchSource(
        collector,
        buffer,
        ages=ages,
        drop_incomplete_targets_on_restore=settings.drop_incomplete_targets_on_restore,
        watchdog_timeout_s=settings.watchdog_timeout_s,
    )
