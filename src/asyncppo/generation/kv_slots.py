"""Host-side bookkeeping of the graph engine's KV cache slots: who holds which slot, and resident prefixes.

Used by `generation/graph_engine.py` between steps; pure Python, no tensors. Each sequence owns one slot
(a fixed-size row of the KV cache) from admission to finish. A finished sequence leaves its KV behind as a
*cached prefix*: a later request whose prompt starts with the same token ids takes the slot over and skips
prefilling them (a multi-turn conversation resends its whole history every call).

    FREE --acquire--> BUSY --release(tokens)--> CACHED --acquire (prefix hit, or evicted LRU)--> BUSY
                                                  \\--invalidate (new weights)--> FREE

Decode steps read slots 0..B-1 for a padded batch size B, so busy rows are moved down (`compaction_moves`)
when that lets B shrink.
"""

import heapq
from collections.abc import Sequence
from dataclasses import dataclass


def common_prefix_length(a: Sequence[int], b: Sequence[int]) -> int:
    """Length of the longest common prefix, by binary search over slice comparisons (C speed, not a Python loop)."""
    a, b = tuple(a), tuple(b)
    low, high = 0, min(len(a), len(b))  # a[:low] == b[:low] holds; a[:high + 1] != b[:high + 1] or out of range
    while low < high:
        middle = (low + high + 1) // 2
        if a[:middle] == b[:middle]:
            low = middle
        else:
            high = middle - 1
    return low


@dataclass
class CachedPrefix:
    """KV of `tokens` (positions 0..len-1) resident in a slot, computed with weights `version`."""

    tokens: tuple[int, ...]
    version: int
    last_used: int


@dataclass(frozen=True)
class Acquired:
    """A slot for a new sequence; its KV already holds the first `reused_tokens` prompt tokens."""

    slot: int
    reused_tokens: int


class SlotTable:
    """Slots 0..num_slots-1: free ones handed out lowest first, cached ones kept for prefix reuse, evicted LRU."""

    def __init__(self, num_slots: int, min_reused_tokens: int):
        if num_slots < 1:
            raise ValueError(f"num_slots={num_slots} must be >= 1")
        self.num_slots = num_slots
        self.min_reused_tokens = max(1, min_reused_tokens)
        self._free = list(range(num_slots))  # a heap: the lowest free slot keeps decode batches compact
        self._cached: dict[int, CachedPrefix] = {}
        # Cached slots by their first min_reused_tokens tokens: only those can give a hit, so a prompt is compared
        # with a handful of candidates, not with every resident prefix (hundreds, each hundreds of tokens long).
        self._by_head: dict[tuple[int, ...], set[int]] = {}
        self._busy: set[int] = set()
        self._clock = 0

    @property
    def num_busy(self) -> int:
        return len(self._busy)

    @property
    def num_available(self) -> int:
        """Slots a new sequence can take now (free, or cached and evictable)."""
        return self.num_slots - len(self._busy)

    def cached_prefixes(self) -> dict[int, CachedPrefix]:
        """The resident prefixes by slot (a copy, for tests and metrics)."""
        return dict(self._cached)

    def acquire(self, prompt: Sequence[int], version: int) -> Acquired | None:
        """A slot for `prompt`: the cached slot sharing its longest prefix (at least `min_reused_tokens`, and never
        the whole prompt: its last token must be computed to give the next token's logits), else the lowest
        free slot, else the least recently used cached slot. None when every slot is busy."""
        prompt = tuple(prompt)
        best_slot, best_length = -1, 0
        for slot in self._by_head.get(prompt[: self.min_reused_tokens], ()):
            cached = self._cached[slot]
            if cached.version != version:
                continue
            length = min(common_prefix_length(cached.tokens, prompt), len(prompt) - 1)
            if length > best_length:
                best_slot, best_length = slot, length
        if best_length >= self.min_reused_tokens:
            self._forget(best_slot)
            self._busy.add(best_slot)
            return Acquired(best_slot, best_length)
        slot = self._take_unused_slot(below=self.num_slots)
        return None if slot is None else Acquired(slot, 0)

    def release(self, slot: int, computed_tokens: Sequence[int], version: int) -> None:
        """`slot`'s sequence is done; its KV for `computed_tokens` stays resident until evicted or invalidated."""
        self._busy.remove(slot)
        if computed_tokens:
            self._clock += 1
            tokens = tuple(computed_tokens)
            self._cached[slot] = CachedPrefix(tokens, version, self._clock)
            if len(tokens) >= self.min_reused_tokens:
                self._by_head.setdefault(tokens[: self.min_reused_tokens], set()).add(slot)
        else:
            heapq.heappush(self._free, slot)

    def invalidate(self) -> None:
        """Forget every cached prefix (their KV was computed with weights that are gone)."""
        for slot in self._cached:
            heapq.heappush(self._free, slot)
        self._cached.clear()
        self._by_head.clear()

    def compaction_moves(self, active: Sequence[int], bucket: int) -> list[tuple[int, int]] | None:
        """Moves (src, dst) that bring every slot in `active` below `bucket`, or None if too few slots are unused
        there. Each dst is a free slot (lowest first) or an evicted cached one; src slots become free."""
        movers = sorted((slot for slot in active if slot >= bucket), reverse=True)
        unused_below = sum(1 for slot in range(bucket) if slot not in self._busy)
        if len(movers) > unused_below:
            return None
        moves = []
        for src in movers:
            dst = self._take_unused_slot(below=bucket)
            assert dst is not None, "counted above"
            self._busy.remove(src)
            heapq.heappush(self._free, src)
            moves.append((src, dst))
        return moves

    def _take_unused_slot(self, below: int) -> int | None:
        """Mark busy and return the lowest free slot under `below`, else the LRU cached one under it; or None."""
        if self._free and self._free[0] < below:
            slot = heapq.heappop(self._free)
        else:
            candidates = [slot for slot in self._cached if slot < below]
            if not candidates:
                return None
            slot = min(candidates, key=lambda s: self._cached[s].last_used)
            self._forget(slot)
        self._busy.add(slot)
        return slot

    def _forget(self, slot: int) -> None:
        """Drop `slot`'s cached prefix (taken over or evicted)."""
        tokens = self._cached.pop(slot).tokens
        if len(tokens) >= self.min_reused_tokens:
            head = tokens[: self.min_reused_tokens]
            self._by_head[head].discard(slot)
            if not self._by_head[head]:
                del self._by_head[head]
