"""TrajectoryBuffer: complete prompt groups waiting for their target training step (thread-safe).

The Collector reserves target steps and adds finished groups; the AsyncBatchSource takes one step's groups.

    Collector: reserve(target, version, draw ids) --rollouts--> add_group(draw id, trajectories)
                                  |                                      |
                                  v                                      v
                      reservations {draw id: (target, version)}   groups [(draw id, version, target, trajs)]
                                                                         |
    AsyncBatchSource: take(step, max_age) -- evict version < step - max_age --> N groups of target == step

Backpressure is applied at reservation, not at add: a reservation claims a slot (stored + reserved <= max_size)
and `reserve` returns False when there is no room, so the producer backs off before it starts a rollout. A group
whose rollout already ran is therefore always accepted; blocking `add_group` instead could block the very group
the trainer is waiting for. Every draw id that leaves the buffer is written to the AccountingLedger.
"""

import logging
import threading
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from asyncppo.pipeline.ledger import AccountingLedger, AccountingReport, find_accounting_problems
from asyncppo.pipeline.plain_state import trajectory_from_state, trajectory_to_state
from asyncppo.pipeline.staleness import survives_until
from asyncppo.types import Trajectory

log = logging.getLogger(__name__)

# Drop reasons: every draw id that leaves the buffer untrained is recorded under one of these.
STALE = "stale"  # older than the step's sample_max_age at take()
SURPLUS = "surplus"  # more than num_groups_per_step groups for one target (only after a config change)
MISSED_TARGET = "missed_target"  # its target step was already taken
FAILED_ROLLOUT = "failed_rollout"  # the group's rollout failed (replaced within the failure budget, else fatal)
EXPIRED_ON_RESTORE = "expired_target_on_restore"  # target before the resume step
OUTSIDE_WINDOW_ON_RESTORE = "outside_window_on_restore"  # would be evicted before its target
INCOMPLETE_ON_RESTORE = "incomplete_target_on_restore"  # drop_incomplete_targets_on_restore
OVERFLOW_ON_RESTORE = "overflow_on_restore"  # beyond max_size (the highest targets go)
DROP_REASONS = (
    STALE,
    SURPLUS,
    MISSED_TARGET,
    FAILED_ROLLOUT,
    EXPIRED_ON_RESTORE,
    OUTSIDE_WINDOW_ON_RESTORE,
    INCOMPLETE_ON_RESTORE,
    OVERFLOW_ON_RESTORE,
)


def default_buffer_size(num_groups_per_step: int, max_age: int) -> int:
    """The most the staleness window can hold: the step being trained plus max_age steps ahead."""
    return num_groups_per_step * (max_age + 1)


@dataclass
class BufferedGroup:
    """The G trajectories of one prompt draw, tagged with the version that generated it and its target step."""

    draw_id: int
    generation_version: int
    target_step: int
    trajectories: list[Trajectory]


class TrajectoryBuffer:
    """Groups by target step with reservations, a watermark (last target taken) and exactly-once accounting."""

    def __init__(self, num_groups_per_step: int, max_size: int) -> None:
        if num_groups_per_step < 1:
            raise ValueError(f"num_groups_per_step must be >= 1, got {num_groups_per_step}")
        if max_size < num_groups_per_step:
            raise ValueError(f"max_size {max_size} cannot hold one step's {num_groups_per_step} groups")
        self.num_groups_per_step = num_groups_per_step
        self.max_size = max_size
        self.ledger = AccountingLedger()
        self._condition = threading.Condition()
        self._groups: list[BufferedGroup] = []  # arrival order: take() is FIFO within a target
        self._reserved: dict[int, tuple[int, int]] = {}  # draw id -> (target, generation version)
        self._watermark = -1
        self._revision = 0
        self._listeners: list[Callable[[], None]] = []

    def add_listener(self, callback: Callable[[], None]) -> None:
        """Call `callback` (with no buffer lock held) after every change, so a waiting collector wakes at once."""
        self._listeners.append(callback)

    @property
    def watermark(self) -> int:
        """The last target step taken (or step - 1 after a restore): no target at or below it is produced."""
        with self._condition:
            return self._watermark

    @property
    def revision(self) -> int:
        """Changes on every mutation; the batch source's watchdog counts a change as progress."""
        with self._condition:
            return self._revision

    def size(self) -> int:
        with self._condition:
            return len(self._groups)

    def needed(self, target: int) -> int:
        """Groups target `target` still lacks, counting reserved ones: N - stored - reserved (0 once taken)."""
        with self._condition:
            return self._needed(target)

    def _needed(self, target: int) -> int:
        if target <= self._watermark:
            return 0
        stored = sum(1 for group in self._groups if group.target_step == target)
        reserved = sum(1 for reserved_target, _ in self._reserved.values() if reserved_target == target)
        return max(0, self.num_groups_per_step - stored - reserved)

    def free_slots(self) -> int:
        with self._condition:
            return self.max_size - len(self._groups) - len(self._reserved)

    def is_covered(self, target: int) -> bool:
        """All of the target's groups are stored or being generated (or it was already taken)."""
        return self.needed(target) == 0

    def reserve(self, target: int, generation_version: int, draw_ids: Sequence[int]) -> bool:
        """Claim slots for rollouts of `target`; False (nothing reserved) if the target or the buffer lacks room."""
        with self._condition:
            if len(draw_ids) > min(self._needed(target), self.max_size - len(self._groups) - len(self._reserved)):
                return False
            for draw_id in draw_ids:
                assert draw_id not in self._reserved, f"draw id {draw_id} reserved twice"
                self._reserved[draw_id] = (target, generation_version)
            self._changed()
        self._notify_listeners()
        return True

    def add_group(self, draw_id: int, trajectories: list[Trajectory]) -> None:
        """Store the finished group of a reserved draw (never blocks: its slot was claimed by reserve)."""
        if not trajectories or any(trajectory.group_id != draw_id for trajectory in trajectories):
            raise ValueError(f"group of draw id {draw_id} must be non-empty and carry group_id {draw_id}")
        with self._condition:
            target, version = self._reserved.pop(draw_id)
            if target <= self._watermark:
                self.ledger.record_dropped([draw_id], MISSED_TARGET)
            else:
                self._groups.append(BufferedGroup(draw_id, version, target, trajectories))
            self._changed()
        self._notify_listeners()

    def release(self, draw_id: int, reason: str) -> None:
        """Give up a reservation whose rollout will not produce a group; the draw is recorded as dropped."""
        with self._condition:
            self._reserved.pop(draw_id)
            self.ledger.record_dropped([draw_id], reason)
            self._changed()
        self._notify_listeners()

    def unreserve(self, draw_id: int) -> None:
        """Give up a reservation whose rollout will run again (its generator died): the draw is not booked; the
        collector holds it as pending and reserves it anew, with the weight version it then runs under."""
        with self._condition:
            self._reserved.pop(draw_id)
            self._changed()
        self._notify_listeners()

    def take(self, step: int, max_age: int) -> list[BufferedGroup] | None:
        """Evict groups older than `max_age` versions, then pop the first N groups targeting `step` if all N are here.

        Returns None (having evicted) while fewer than N are stored. Extra groups for `step` (possible only after
        a restore with a smaller num_prompts_per_step) are dropped as SURPLUS, never carried silently.
        """
        with self._condition:
            kept: list[BufferedGroup] = []
            for group in self._groups:
                if group.generation_version < step - max_age:
                    self.ledger.record_dropped([group.draw_id], STALE)
                elif group.target_step < step:
                    self.ledger.record_dropped([group.draw_id], MISSED_TARGET)
                else:
                    kept.append(group)
            changed = len(kept) != len(self._groups)
            self._groups = kept
            matching = [group for group in kept if group.target_step == step]
            chosen: list[BufferedGroup] | None = None
            if len(matching) >= self.num_groups_per_step:
                chosen = matching[: self.num_groups_per_step]
                surplus = matching[self.num_groups_per_step :]
                self._groups = [group for group in kept if group.target_step != step]
                self.ledger.record_trained(group.draw_id for group in chosen)
                self.ledger.record_dropped((group.draw_id for group in surplus), SURPLUS)
                self._watermark = max(self._watermark, step)
                changed = True
            if changed:
                self._changed()
        if changed:
            self._notify_listeners()
        return chosen

    def wait_for_change(self, seen_revision: int, timeout_s: float) -> int:
        """Block until the revision differs from `seen_revision` or `timeout_s` passes; returns the revision."""
        with self._condition:
            self._condition.wait_for(lambda: self._revision != seen_revision, timeout=timeout_s)
            return self._revision

    def signal(self) -> None:
        """Wake waiters without a data change (the collector calls it when it fails)."""
        with self._condition:
            self._changed()

    def _changed(self) -> None:
        self._revision += 1
        self._condition.notify_all()

    def _notify_listeners(self) -> None:
        for callback in self._listeners:
            callback()

    def buffered_ids(self) -> list[int]:
        with self._condition:
            return [group.draw_id for group in self._groups]

    def dropped_counts(self) -> dict[str, int]:
        with self._condition:
            return self.ledger.dropped_counts()

    def accounting_report(self, pending: list[int], next_draw_id: int) -> AccountingReport:
        """The books given the collector's unbuffered draws; call with the collector frozen so both agree."""
        with self._condition:
            buffered = [group.draw_id for group in self._groups]
            return AccountingReport(
                trained=self.ledger.trained.ranges(),
                dropped={reason: ids.ranges() for reason, ids in self.ledger.dropped.items()},
                buffered=buffered,
                pending=pending,
                next_draw_id=next_draw_id,
                problems=find_accounting_problems(self.ledger, buffered, pending, next_draw_id),
            )

    def describe(self) -> str:
        """What the buffer holds, for stall errors: groups per target and version, reservations per target."""
        with self._condition:
            stored: dict[int, Counter[int]] = {}
            for group in self._groups:
                stored.setdefault(group.target_step, Counter())[group.generation_version] += 1
            by_target = {target: dict(sorted(versions.items())) for target, versions in sorted(stored.items())}
            reserved = dict(sorted(Counter(target for target, _ in self._reserved.values()).items()))
            return (
                f"buffer holds {len(self._groups)}/{self.max_size} groups (watermark {self._watermark}); "
                f"stored groups by target {{target: {{version: count}}}}: {by_target}; "
                f"reserved (in flight) by target: {reserved}"
            )

    def state_dict(self) -> dict[str, Any]:
        """Stored groups, watermark and ledger as plain data. Reservations are not saved: the Collector saves
        their rows as pending so a resumed run regenerates them. Call it while the collector is frozen."""
        with self._condition:
            return {
                "groups": [
                    {
                        "draw_id": group.draw_id,
                        "generation_version": group.generation_version,
                        "target_step": group.target_step,
                        "trajectories": [trajectory_to_state(trajectory) for trajectory in group.trajectories],
                    }
                    for group in self._groups
                ],
                "watermark": self._watermark,
                "max_size": self.max_size,
                "ledger": self.ledger.state_dict(),
            }

    def load_state_dict(
        self, state: dict[str, Any], step: int, *, drop_incomplete_targets: bool, max_age_of_step: Callable[[int], int]
    ) -> None:
        """Restore for a run resuming at `step`, recording every group it drops.

        Groups targeting steps before `step` go; so do groups that some take() before their target would evict.
        Targets with all N groups are replayed exactly. Incomplete targets are dropped (drop_incomplete_targets,
        regenerated from scratch) or kept for the collector to gap-fill (faster, but biased toward fast rollouts).
        Beyond max_size the highest targets go. The watermark becomes step - 1.
        """
        missing = {"groups", "watermark", "ledger"} - set(state)
        if missing:
            raise ValueError(f"trajectory buffer state lacks keys {sorted(missing)}")
        if state.get("max_size", self.max_size) != self.max_size:
            log.warning(
                "trajectory buffer max_size changed from %s to %s: the new size applies",
                state["max_size"],
                self.max_size,
            )
        with self._condition:
            if self._groups or self._reserved:
                raise RuntimeError("load_state_dict must run on a fresh buffer, before the collector starts")
            self.ledger.load_state_dict(state["ledger"])
            groups = [_group_from_state(entry) for entry in state["groups"]]
            valid: list[BufferedGroup] = []
            for group in groups:
                if group.target_step < step:
                    self.ledger.record_dropped([group.draw_id], EXPIRED_ON_RESTORE)
                elif group.generation_version > group.target_step or not survives_until(
                    group.generation_version, group.target_step, max_age_of_step, first_step=step
                ):
                    self.ledger.record_dropped([group.draw_id], OUTSIDE_WINDOW_ON_RESTORE)
                else:
                    valid.append(group)
            counts = Counter(group.target_step for group in valid)
            if drop_incomplete_targets:
                incomplete = [group for group in valid if counts[group.target_step] < self.num_groups_per_step]
                self.ledger.record_dropped((group.draw_id for group in incomplete), INCOMPLETE_ON_RESTORE)
                valid = [group for group in valid if counts[group.target_step] >= self.num_groups_per_step]
            by_target = sorted(valid, key=lambda group: group.target_step)  # stable: FIFO within a target
            self.ledger.record_dropped((group.draw_id for group in by_target[self.max_size :]), OVERFLOW_ON_RESTORE)
            kept = {group.draw_id for group in by_target[: self.max_size]}
            self._groups = [group for group in valid if group.draw_id in kept]
            self._watermark = step - 1
            self._changed()


def _group_from_state(entry: dict[str, Any]) -> BufferedGroup:
    return BufferedGroup(
        draw_id=int(entry["draw_id"]),
        generation_version=int(entry["generation_version"]),
        target_step=int(entry["target_step"]),
        trajectories=[trajectory_from_state(trajectory) for trajectory in entry["trajectories"]],
    )
