"""Exactly-once accounting of prompt draws: every draw id ends trained, dropped with a reason, or still pending.

The TrajectoryBuffer owns one AccountingLedger (saved in its state): `take` records trained draws, eviction and
restore record drops, the Collector records failed rollouts through the buffer.

    Collector draws a prompt -> draw id d -> pending -> in flight -> buffered -> trained (take)
                                                             |            |
                                                             +------------+--> dropped[reason]
    find_accounting_problems(ledger, buffered, pending, next_draw_id): missing or doubly accounted ids

Ids are kept as sorted disjoint [start, end) ranges: trained draws are nearly contiguous, so a long run's
ledger stays a few numbers instead of millions.
"""

import bisect
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any


class AccountingError(RuntimeError):
    """A draw id was accounted twice (trained twice, or trained and dropped): a pipeline bug, never ignored."""


class IdRanges:
    """A set of non-negative ints stored as sorted, disjoint, non-adjacent [start, end) ranges."""

    def __init__(self) -> None:
        self._starts: list[int] = []
        self._ends: list[int] = []

    def __contains__(self, draw_id: int) -> bool:
        index = bisect.bisect_right(self._starts, draw_id) - 1
        return index >= 0 and draw_id < self._ends[index]

    def __len__(self) -> int:
        return sum(end - start for start, end in zip(self._starts, self._ends, strict=True))

    def __iter__(self) -> Iterator[int]:
        for start, end in zip(self._starts, self._ends, strict=True):
            yield from range(start, end)

    def add(self, draw_id: int) -> None:
        """Insert one id; raises AccountingError if it is already present."""
        index = bisect.bisect_right(self._starts, draw_id) - 1
        if index >= 0 and draw_id < self._ends[index]:
            raise AccountingError(f"draw id {draw_id} is already in this set")
        joins_left = index >= 0 and self._ends[index] == draw_id
        joins_right = index + 1 < len(self._starts) and self._starts[index + 1] == draw_id + 1
        if joins_left and joins_right:
            self._ends[index] = self._ends[index + 1]
            del self._starts[index + 1], self._ends[index + 1]
        elif joins_left:
            self._ends[index] = draw_id + 1
        elif joins_right:
            self._starts[index + 1] = draw_id
        else:
            self._starts.insert(index + 1, draw_id)
            self._ends.insert(index + 1, draw_id + 1)

    def ranges(self) -> list[tuple[int, int]]:
        """The [start, end) ranges, ascending."""
        return list(zip(self._starts, self._ends, strict=True))

    def state(self) -> list[list[int]]:
        """Plain data: [[start, end], ...]."""
        return [[start, end] for start, end in self.ranges()]

    @classmethod
    def from_state(cls, state: list[list[int]]) -> "IdRanges":
        ranges = cls()
        for start, end in state:
            if start >= end:
                raise ValueError(f"id range [{start}, {end}) is empty or reversed")
            ranges._starts.append(int(start))
            ranges._ends.append(int(end))
        if any(ranges._starts[k] <= ranges._ends[k - 1] for k in range(1, len(ranges._starts))):
            raise ValueError(f"id ranges must be sorted and disjoint, got {state[:8]}...")
        return ranges


class AccountingLedger:
    """Which draw ids were trained and which were dropped (by reason). Not thread-safe: its owner locks."""

    def __init__(self) -> None:
        self.trained = IdRanges()
        self.dropped: dict[str, IdRanges] = {}

    def is_accounted(self, draw_id: int) -> bool:
        return draw_id in self.trained or any(draw_id in ids for ids in self.dropped.values())

    def record_trained(self, draw_ids: Iterable[int]) -> None:
        for draw_id in draw_ids:
            self._check_new(draw_id, "trained")
            self.trained.add(draw_id)

    def record_dropped(self, draw_ids: Iterable[int], reason: str) -> None:
        for draw_id in draw_ids:
            self._check_new(draw_id, f"dropped ({reason})")
            self.dropped.setdefault(reason, IdRanges()).add(draw_id)

    def _check_new(self, draw_id: int, outcome: str) -> None:
        if self.is_accounted(draw_id):
            raise AccountingError(f"draw id {draw_id} recorded as {outcome} but it was already {self.outcome(draw_id)}")

    def outcome(self, draw_id: int) -> str | None:
        """'trained', 'dropped/<reason>' or None (not yet accounted)."""
        if draw_id in self.trained:
            return "trained"
        for reason, ids in self.dropped.items():
            if draw_id in ids:
                return f"dropped/{reason}"
        return None

    def dropped_counts(self) -> dict[str, int]:
        return {reason: len(ids) for reason, ids in sorted(self.dropped.items())}

    def state_dict(self) -> dict[str, Any]:
        return {
            "trained": self.trained.state(),
            "dropped": {reason: ids.state() for reason, ids in self.dropped.items()},
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.trained = IdRanges.from_state(state["trained"])
        self.dropped = {str(reason): IdRanges.from_state(ids) for reason, ids in state["dropped"].items()}


@dataclass
class AccountingReport:
    """Where every draw id is, at one instant: the books of AsyncBatchSource.accounting()."""

    trained: list[tuple[int, int]]
    """Trained draw ids as [start, end) ranges."""
    dropped: dict[str, list[tuple[int, int]]]
    """Dropped draw ids by reason, as ranges."""
    buffered: list[int]
    """In the buffer, waiting for their target step."""
    pending: list[int]
    """Drawn but not buffered: waiting to start or in flight."""
    next_draw_id: int
    """Ids below this have been assigned."""
    problems: list[str]
    """Missing or doubly accounted ids (empty when the books balance)."""

    def summary(self) -> str:
        """The books in one line of counts: drawn, trained, dropped by reason, buffered, pending, problems."""
        trained = sum(end - start for start, end in self.trained)
        dropped = {reason: sum(end - start for start, end in ids) for reason, ids in sorted(self.dropped.items())}
        by_reason = ", ".join(f"{reason} {count}" for reason, count in dropped.items())
        line = (
            f"{self.next_draw_id} prompts drawn: {trained} trained, {sum(dropped.values())} dropped"
            f"{f' ({by_reason})' if by_reason else ''}, {len(self.buffered)} buffered, {len(self.pending)} pending"
        )
        return f"{line}; the books do not balance: {'; '.join(self.problems)}" if self.problems else line


def find_accounting_problems(
    ledger: AccountingLedger, buffered: Iterable[int], pending: Iterable[int], next_draw_id: int
) -> list[str]:
    """Every id in [0, next_draw_id) must be in exactly one of: trained, one dropped reason, buffered, pending.

    Returns one line per problem (empty when the books balance); ids at or past next_draw_id are problems too.
    """
    places: dict[int, list[str]] = {}
    for draw_id in ledger.trained:
        places.setdefault(draw_id, []).append("trained")
    for reason, ids in ledger.dropped.items():
        for draw_id in ids:
            places.setdefault(draw_id, []).append(f"dropped/{reason}")
    for draw_id in buffered:
        places.setdefault(draw_id, []).append("buffered")
    for draw_id in pending:
        places.setdefault(draw_id, []).append("pending")
    problems = [f"draw id {d} is in {where}" for d, where in sorted(places.items()) if len(where) > 1]
    problems += [f"draw id {d} was never drawn but is {places[d]}" for d in sorted(places) if d >= next_draw_id]
    missing = [d for d in range(next_draw_id) if d not in places]
    if missing:
        problems.append(f"{len(missing)} draw ids are unaccounted for: {missing[:20]}")
    return problems
