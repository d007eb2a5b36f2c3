"""Collector: a background thread that draws prompts and runs their rollouts ahead of training, into the buffer.

Built by the driver's builders with a rollout function; driven by AsyncBatchSource (weight updates, state).

    prompt stream --epochs--> pending rows [(draw id, row)] --reserve lowest needed target (gap-fill)-->
        one thread per prompt group: rollout([row], [draw id]) --> buffer.add_group (or failure channel)
        a rollout whose generator died (GenerationHealth) --> reservation given back, row to the front of pending
    set_weight_version(v): the window of collectable targets moves (AgeSchedule.collectable_targets)
    time_tally: seconds the loop waited, by why it could start nothing, and seconds of failed rollouts

Draw ids are assigned when a row leaves the prompt stream, so a row drawn but not yet started (the rest of a
batch, kept in `pending`) or in flight when a checkpoint is taken is saved with its id and regenerated on
resume: no prompt is lost or drawn twice. A group whose generator process died under it keeps its draw id and runs
again once the generators serve (no rollout starts while one is being restarted); it is never booked as failed.
One lock (a Condition over an RLock) guards all of it; every wait re-checks state under that lock with a timeout,
so a notification can never be lost. That one lock is also why this stays one module past 400 lines: every method
of Collector reads and writes the same in-flight, pending and failure state under it, and a split would hand the
lock and that state between modules.
"""

import logging
import threading
import time
from collections import deque
from collections.abc import Generator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from asyncppo.pipeline.buffer import FAILED_ROLLOUT, TrajectoryBuffer
from asyncppo.pipeline.epochs import EpochCycler
from asyncppo.pipeline.errors import CollectorError, GenerationInterrupted, RunEndingError, StallError
from asyncppo.pipeline.failures import StepFailureBudget
from asyncppo.pipeline.plain_state import check_plain_data
from asyncppo.pipeline.sources import GenerationHealth, GroupOutcome, GroupRolloutFn, PromptBatches, Row
from asyncppo.pipeline.staleness import AgeSchedule
from asyncppo.pipeline.time_tally import (
    BUFFER_FULL_BACKOFF,
    COLLECTOR_TIME_REASONS,
    FAILED_TRAJECTORY,
    GENERATION_LIMIT_PAUSE,
    GENERATOR_RESTART_WAIT,
    REFIT_EVENT_WAIT,
    TimeTally,
)
from asyncppo.types import Trajectory

log = logging.getLogger(__name__)


@dataclass
class _InFlight:
    row: Row
    target: int
    generation_version: int
    generator_deaths: int
    """GenerationHealth.deaths() when the rollout started (0 without a health)."""


class Collector:
    """Keeps the buffer filled for the targets the staleness window allows; see the module docstring."""

    def __init__(
        self,
        prompts: PromptBatches,
        rollout: GroupRolloutFn,
        buffer: TrajectoryBuffer,
        *,
        initial_version: int,
        ages: AgeSchedule,
        max_concurrent_groups: int,
        in_flight_weight_updates: bool,
        drain_timeout_s: float,
        idle_recheck_s: float = 0.5,
        failure_budget: StepFailureBudget,
        health: GenerationHealth | None = None,
    ) -> None:
        """`rollout` is called with one row and its draw id at a time; a failed group (returned as its exception,
        or raised) is dropped and replaced until `failure_budget` runs out, which stops collection. With `health`,
        a group that failed because a generator died runs again instead, and a RunEndingError stops collection."""
        if max_concurrent_groups < 1:
            raise ValueError(f"max_concurrent_groups must be >= 1, got {max_concurrent_groups}")
        self.initial_version = initial_version
        self.in_flight_weight_updates = in_flight_weight_updates
        self._prompts = prompts
        self._rollout = rollout
        self._buffer = buffer
        self._ages = ages
        self._max_concurrent = max_concurrent_groups
        self._drain_timeout_s = drain_timeout_s
        self._idle_recheck_s = idle_recheck_s
        self._failure_budget = failure_budget
        self._health = health
        self._condition = threading.Condition(threading.RLock())
        self._version = initial_version
        self._paused = False
        self._stopping = False
        self._pending: deque[tuple[int, Row]] = deque()
        self._running: dict[int, _InFlight] = {}
        self._threads: set[threading.Thread] = set()
        self._loop_thread: threading.Thread | None = None
        self._next_draw_id = 0
        self._num_groups_completed = 0
        self._num_failed_rollouts = 0
        self._num_rerun_rollouts = 0
        self._failure: tuple[str, BaseException] | None = None
        self._stream = EpochCycler(prompts)  # only the loop thread reads it
        self._drawing_since: float | None = None  # set while the loop reads the stream outside the lock
        self.time_tally = TimeTally(COLLECTOR_TIME_REASONS)
        buffer.add_listener(self._wake)

    # ---- driver-facing controls -------------------------------------------------------------------------
    def start(self) -> None:
        """Start the collection thread (once; after any load_state_dict)."""
        with self._condition:
            if self._loop_thread is not None:
                return
            self._loop_thread = threading.Thread(target=self._loop, name="collector", daemon=True)
            self._loop_thread.start()

    @property
    def version(self) -> int:
        with self._condition:
            return self._version

    @property
    def num_groups_completed(self) -> int:
        with self._condition:
            return self._num_groups_completed

    @property
    def num_failed_rollouts(self) -> int:
        with self._condition:
            return self._num_failed_rollouts

    @property
    def num_rerun_rollouts(self) -> int:
        """Rollouts put back to run again because their generator died (since this collector started)."""
        with self._condition:
            return self._num_rerun_rollouts

    def set_weight_version(self, version: int) -> None:
        """The generators now hold `version`: new rollouts are tagged with it and the target window moves."""
        with self._condition:
            if version < self._version:
                raise ValueError(f"weight version may not go back: {version} after {self._version}")
            self._version = version
            self._condition.notify_all()

    def prepare_for_weight_update(self) -> None:
        """Stop starting rollouts; without in-flight updates also wait until none is running (StallError after
        drain_timeout_s). Raises the collector's failure, if any."""
        self.raise_if_failed()
        with self._condition:
            self._paused = True
            if self.in_flight_weight_updates:
                return
            drained = self._condition.wait_for(
                lambda: not self._running or self._failure is not None, timeout=self._drain_timeout_s
            )
            running = sorted(self._running)
        self.raise_if_failed()
        if not drained:
            raise StallError(
                f"weight update: {len(running)} rollouts still running after {self._drain_timeout_s} s "
                f"(draw ids {running[:20]}); {self.describe()}"
            )

    def resume_after_weight_update(self) -> None:
        with self._condition:
            self._paused = False
            self._condition.notify_all()

    def failed_groups_this_step(self) -> int:
        """Groups that failed since the last `step_filled()`."""
        return self._failure_budget.count

    def step_filled(self) -> None:
        """A step's batch was handed to training: the failure budget starts over for the next one."""
        self._failure_budget.reset()

    def raise_if_failed(self) -> None:
        """Deliver a recorded rollout or loop failure to the caller (the driver), with the original as cause; a
        RunEndingError as it is (its message is the line the run ends with)."""
        with self._condition:
            failure = self._failure
        if failure is not None:
            message, error = failure
            if isinstance(error, RunEndingError):
                raise error
            raise CollectorError(message) from error

    @contextmanager
    def frozen(self) -> Generator[None]:
        """Hold the collector still (no draws, starts or completions) so several states can be read atomically.

        Waits (up to drain_timeout_s, then StallError) for a draw from the prompt stream to finish."""
        with self._condition:
            if not self._condition.wait_for(lambda: self._drawing_since is None, timeout=self._drain_timeout_s):
                raise StallError(f"the prompt stream returned no batch within {self._drain_timeout_s} s")
            yield

    def stop(self, timeout_s: float = 10.0) -> None:
        """Stop the loop and wait (bounded) for running rollouts; their results are discarded, not buffered."""
        with self._condition:
            self._stopping = True
            self._condition.notify_all()
            threads = [*self._threads, *([self._loop_thread] if self._loop_thread else [])]
        deadline = time.monotonic() + timeout_s
        for thread in threads:
            thread.join(timeout=max(0.0, deadline - time.monotonic()))
        alive = [thread.name for thread in threads if thread.is_alive()]
        if alive:
            log.warning("collector stop: %d threads still running after %.1f s: %s", len(alive), timeout_s, alive)

    # ---- the collection loop -----------------------------------------------------------------------------
    def _wake(self) -> None:
        with self._condition:
            self._condition.notify_all()

    def _loop(self) -> None:
        try:
            while True:
                with self._condition:
                    work = self._wait_for_work()
                    if work is None:
                        return
                    target, count = work
                    if len(self._pending) >= count:
                        self._start_rollouts(target, count)
                        continue
                    self._drawing_since = time.monotonic()
                self._draw_batch()
        except Exception as error:  # the failure channel: recorded for the driver, never swallowed
            self._record_failure(f"collector loop raised {type(error).__name__}: {error}", error)

    def _draw_batch(self) -> None:
        """Append the stream's next batch to `pending`, giving each row the next draw id.

        The stream is read without the lock, so a slow dataset never blocks the driver (take() wakes the
        collector through the lock); state_dict waits for `_drawing_since` to clear, so the stream position and
        `pending` are always read together.
        """
        rows: list[Row] = []
        try:
            rows = self._stream.next_rows()
        finally:
            with self._condition:
                for row in rows:
                    self._pending.append((self._next_draw_id, row))
                    self._next_draw_id += 1
                self._drawing_since = None
                self._condition.notify_all()

    def _wait_for_work(self) -> tuple[int, int] | None:
        """(target, number of groups to start), or None when stopping. Re-checks after every wake or timeout."""
        while not self._stopping and self._failure is None:
            work, idle_reason = self._next_work()
            if work is not None:
                return work
            started = time.monotonic()
            self._condition.wait(timeout=self._idle_recheck_s)
            self.time_tally.add(idle_reason, time.monotonic() - started)
        return None

    def _next_work(self) -> tuple[tuple[int, int] | None, str]:
        """((lowest target still needing groups, how many to start), "") or (None, why nothing may start)."""
        if self._paused:
            return None, REFIT_EVENT_WAIT
        if self._health is not None:
            ended = self._health.failure()
            if ended is not None:
                raise ended  # the loop records it for the driver
            if not self._health.serving():
                return None, GENERATOR_RESTART_WAIT
        if len(self._running) >= self._max_concurrent:
            return None, GENERATION_LIMIT_PAUSE
        needing = [(target, needed) for target in self._targets() if (needed := self._buffer.needed(target)) > 0]
        capacity = min(self._max_concurrent - len(self._running), self._buffer.free_slots())
        if not needing or capacity <= 0:
            return None, GENERATION_LIMIT_PAUSE if not needing else BUFFER_FULL_BACKOFF
        return (needing[0][0], min(needing[0][1], capacity)), ""

    def _targets(self) -> list[int]:
        """The targets this version may reserve, plus its own step when that still lacks groups.

        The own step only lacks groups after a failed group was released once its version had been published
        (the N+1 rule covers it before that); data of version v trained at step v is on-policy, so refilling
        it with the current weights is always fresh enough, and without it the target would have no producer.
        """
        targets = self._ages.collectable_targets(self._version, self.initial_version)
        if self._version not in targets and self._buffer.needed(self._version) > 0:
            return [self._version, *targets]
        return targets

    def _start_rollouts(self, target: int, count: int) -> None:
        # Reserve before popping: if the buffer refused, the rows would otherwise vanish from the accounting.
        if not self._buffer.reserve(target, self._version, [self._pending[index][0] for index in range(count)]):
            raise RuntimeError(f"buffer refused {count} groups for target {target} that it reported as needed")
        draws = [self._pending.popleft() for _ in range(count)]
        deaths = self._health.deaths() if self._health is not None else 0
        for draw_id, row in draws:
            self._running[draw_id] = _InFlight(row, target, self._version, deaths)
            thread = threading.Thread(target=self._run_rollout, args=(draw_id, row), name=f"rollout-{draw_id}")
            thread.daemon = True  # a hung rollout must not keep the process alive after stop()
            self._threads.add(thread)
            thread.start()

    def _run_rollout(self, draw_id: int, row: Row) -> None:
        started = time.monotonic()
        try:
            try:
                outcome = self._single_outcome(draw_id, self._rollout([row], [draw_id]))
            except Exception as error:  # a raised call fails its one group, like a returned failure
                outcome = error
            if isinstance(outcome, RunEndingError):
                self._record_failure(str(outcome), outcome)
                return
            if isinstance(outcome, Exception) and self._lost_to_a_generator_death(draw_id, outcome):
                self._rerun_later(draw_id)
                return
            if isinstance(outcome, Exception):  # fault tolerance is the point: counted, replaced or fatal
                self.time_tally.add(FAILED_TRAJECTORY, time.monotonic() - started)
                self._rollout_failed(draw_id, outcome)
                return
            self._rollout_done(draw_id, outcome)
        finally:
            with self._condition:
                self._threads.discard(threading.current_thread())

    @staticmethod
    def _single_outcome(draw_id: int, outcomes: list[GroupOutcome]) -> GroupOutcome:
        """The one outcome of a one-row call, checked: a non-empty group whose trajectories carry `draw_id`."""
        if len(outcomes) != 1:
            raise ValueError(f"rollout answered {len(outcomes)} outcomes for 1 row (draw id {draw_id})")
        outcome = outcomes[0]
        if not isinstance(outcome, Exception) and (not outcome or any(t.group_id != draw_id for t in outcome)):
            raise ValueError(
                f"rollout must return one non-empty group with group_id {draw_id}, got {[t.group_id for t in outcome]}"
            )
        return outcome

    def _rollout_done(self, draw_id: int, trajectories: list[Trajectory]) -> None:
        with self._condition:
            if self._stopping:
                return  # a stopped collector changes nothing: the draw stays in flight in its accounting
            self._running.pop(draw_id)
            self._buffer.add_group(draw_id, trajectories)
            self._num_groups_completed += 1
            self._condition.notify_all()

    def _lost_to_a_generator_death(self, draw_id: int, error: Exception) -> bool:
        """Whether the group failed because a generator died while it ran (asked without the lock: it may probe)."""
        if self._health is None:
            return False
        if isinstance(error, GenerationInterrupted):
            return True
        with self._condition:
            in_flight = self._running.get(draw_id)
        return in_flight is not None and self._health.lost_requests_since(in_flight.generator_deaths)

    def _rerun_later(self, draw_id: int) -> None:
        """Give the group's reservation back and put its row first in line, under the same draw id: it starts again
        once the generators serve (with the weights of that moment), and the books never see the lost attempt."""
        with self._condition:
            if self._stopping:
                return
            in_flight = self._running.pop(draw_id)
            self._buffer.unreserve(draw_id)
            self._pending.appendleft((draw_id, in_flight.row))
            self._num_rerun_rollouts += 1
            self._condition.notify_all()

    def _rollout_failed(self, draw_id: int, error: Exception) -> None:
        with self._condition:
            if self._stopping:
                return
            in_flight = self._running.pop(draw_id)
            self._buffer.release(draw_id, FAILED_ROLLOUT)
            self._num_failed_rollouts += 1
            # The released target needs a group again, so the loop draws a fresh prompt for it.
            exhausted = self._failure_budget.record(in_flight.target, draw_id, error)
            if exhausted is not None:
                self._record_failure(f"{exhausted} (weight version {in_flight.generation_version})", exhausted)
            self._condition.notify_all()

    def _record_failure(self, message: str, error: BaseException) -> None:
        with self._condition:
            if self._failure is None:  # the first failure is the cause; later ones are its consequences
                self._failure = (message, error)
                # Debug only: the driver raises it as a CollectorError and `asyncppo train` prints it as its one
                # `error:` line; logging it here too put the same failure on the console twice.
                log.debug("collector failed: %s", message)
            self._condition.notify_all()
        self._buffer.signal()

    # ---- inspection and state ----------------------------------------------------------------------------
    def in_flight_ids(self) -> list[int]:
        with self._condition:
            return sorted(self._running)

    def pending_ids(self) -> list[int]:
        """Drawn rows not yet in the buffer: waiting to start or in flight."""
        with self._condition:
            return sorted([draw_id for draw_id, _ in self._pending] + list(self._running))

    @property
    def next_draw_id(self) -> int:
        with self._condition:
            return self._next_draw_id

    def describe(self) -> str:
        with self._condition:
            in_flight = {draw_id: info.target for draw_id, info in sorted(self._running.items())[:20]}
            alive = self._loop_thread is not None and self._loop_thread.is_alive()
            drawing = "no" if self._drawing_since is None else f"for {time.monotonic() - self._drawing_since:.1f} s"
            return (
                f"collector: weight version {self._version} (initial {self.initial_version}), "
                f"paused {self._paused}, loop running {alive}, drawing prompts {drawing}, "
                f"{len(self._running)} rollouts in flight "
                f"(draw id -> target: {in_flight}), {len(self._pending)} rows waiting, "
                f"next draw id {self._next_draw_id}, {self._num_rerun_rollouts} rollouts rerun after a generator "
                f"died, failure: {self._failure[0] if self._failure else None}"
            )

    def state_dict(self) -> dict[str, Any]:
        """Prompt stream position, every drawn-but-unbuffered row with its draw id, and counters (plain data)."""
        with self.frozen():
            unfinished = [*self._pending, *((draw_id, info.row) for draw_id, info in self._running.items())]
            unfinished.sort(key=lambda item: item[0])
            for draw_id, row in unfinished:
                check_plain_data(row, f"prompt row of draw id {draw_id}")
            return {
                "prompts": self._prompts.state_dict(),
                "pending": [{"draw_id": draw_id, "row": row} for draw_id, row in unfinished],
                "next_draw_id": self._next_draw_id,
                "num_groups_completed": self._num_groups_completed,
                "num_failed_rollouts": self._num_failed_rollouts,
            }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        with self._condition:
            if self._loop_thread is not None:
                raise RuntimeError("load_state_dict must run before the collector starts")
            self._prompts.load_state_dict(state["prompts"])
            self._pending = deque((int(entry["draw_id"]), dict(entry["row"])) for entry in state["pending"])
            self._next_draw_id = int(state["next_draw_id"])
            self._num_groups_completed = int(state["num_groups_completed"])
            self._num_failed_rollouts = int(state["num_failed_rollouts"])
            self._stream.restart()
