"""Batch sources: where the driver's training step gets its trajectories from (the seam between sync and async).

    prompts --(sync: generate now, with the current weights)--> StepBatch --> driver step
    prompts --collector --> TrajectoryBuffer --(async: take(step))--> StepBatch --> driver step

The driver only knows `BatchSource`; sync and async PPO differ in which source it is handed.
"""

from collections import deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from asyncppo.pipeline.failures import StepFailureBudget
from asyncppo.types import Trajectory

Row = dict[str, Any]
RolloutFn = Callable[[Sequence[Row], int], list[Trajectory]]
"""(prompt rows, first group id) -> trajectories of every prompt's group, group ids consecutive from there."""
GroupOutcome = list[Trajectory] | Exception
"""One prompt group's trajectories, or the exception that ended its rollout (after the rollout's own retries)."""
GroupRolloutsFn = Callable[[Sequence[Row], Sequence[int]], list[GroupOutcome]]
"""(prompt rows, their group ids) -> one outcome per row, in order; failures are values, not raised."""


@dataclass
class StepBatch:
    """The trajectories of one training step and what the source reports about producing them."""

    trajectories: list[Trajectory]
    num_prompts: int
    metrics: dict[str, float] = field(default_factory=dict[str, float])


class PromptBatches(Protocol):
    """A resumable stream of prompt batches (data.prompt_stream.PromptStream satisfies it)."""

    def __iter__(self) -> Iterator[list[Row]]: ...

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...


class BatchSource(Protocol):
    """What the driver pulls each step's batch from."""

    def next_batch(self, step: int) -> StepBatch:
        """The trajectories to train on at `step` (blocks until they exist, or raises saying what it waited for)."""
        ...

    def state_dict(self) -> dict[str, Any]:
        """Everything needed to resume without losing or repeating a prompt."""
        ...

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore from state_dict()."""
        ...

    def close(self) -> None:
        """Stop background work, if any."""
        ...

    def before_weight_update(self) -> None:
        """Called right before the driver publishes new weights (async: pause or drain rollouts)."""
        ...

    def after_weight_update(self, version: int) -> None:
        """Called once the generators hold weight `version` (async: move the staleness window, resume)."""
        ...


class SyncBatchSource:
    """Generates each step's batch on demand with the weights the generators hold now (sync PPO).

    `rollout` answers each row with its group or the exception that ended it. A failed group is dropped and a
    fresh prompt takes its place (the rows a refill draws beyond its need wait in `pending`, checkpointed),
    until the step's failure budget runs out: then StepFillError. Group ids are draw ids, one per row drawn.
    """

    def __init__(
        self,
        prompts: PromptBatches,
        rollout: GroupRolloutsFn,
        *,
        num_prompts_per_step: int,
        failure_budget: StepFailureBudget,
    ):
        self._prompts = prompts
        self._rollout = rollout
        self._num_prompts = num_prompts_per_step
        self._failures = failure_budget
        self._iterator: Iterator[list[Row]] | None = None
        self._pending: deque[Row] = deque()
        self._next_group_id = 0

    def next_batch(self, step: int) -> StepBatch:
        self._failures.reset()
        groups: list[list[Trajectory]] = []
        while len(groups) < self._num_prompts:
            rows = self._draw(step, self._num_prompts - len(groups))
            group_ids = list(range(self._next_group_id, self._next_group_id + len(rows)))
            self._next_group_id += len(rows)
            outcomes = self._rollout(rows, group_ids)
            if len(outcomes) != len(rows):
                raise ValueError(f"rollout answered {len(outcomes)} outcomes for {len(rows)} rows")
            for group_id, outcome in zip(group_ids, outcomes, strict=True):
                if not isinstance(outcome, Exception):
                    groups.append(outcome)
                    continue
                error = self._failures.record(step, group_id, outcome)
                if error is not None:
                    raise error
        trajectories = [trajectory for group in groups for trajectory in group]
        metrics = {"rollout/failed_groups": float(self._failures.count)}
        return StepBatch(trajectories=trajectories, num_prompts=len(groups), metrics=metrics)

    def _draw(self, step: int, count: int) -> list[Row]:
        """The next `count` rows: rows left over from an earlier refill first, then the stream's batches."""
        while len(self._pending) < count:
            self._pending.extend(self._next_stream_batch(step))
        return [self._pending.popleft() for _ in range(count)]

    def _next_stream_batch(self, step: int) -> list[Row]:
        if self._iterator is None:
            self._iterator = iter(self._prompts)
        try:
            return list(next(self._iterator))
        except StopIteration:
            raise RuntimeError(f"the training data ran out before step {step} (ppo.max_num_epochs reached)") from None

    def state_dict(self) -> dict[str, Any]:
        return {
            "prompts": self._prompts.state_dict(),
            "next_group_id": self._next_group_id,
            "pending": list(self._pending),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._prompts.load_state_dict(state["prompts"])
        self._next_group_id = int(state["next_group_id"])
        self._pending = deque(dict(row) for row in state.get("pending", []))
        self._iterator = None

    def close(self) -> None:
        return None

    def before_weight_update(self) -> None:
        return None  # batches are generated on demand, so nothing runs while weights change

    def after_weight_update(self, version: int) -> None:
        return None


def strict_group_rollouts(rollout: RolloutFn) -> GroupRolloutsFn:
    """A batch rollout (consecutive group ids, raises on any failure) as a GroupRolloutsFn: one call for all
    rows, so the engine batches them; a failure still ends the step (there are no per-group outcomes)."""

    def run(rows: Sequence[Row], group_ids: Sequence[int]) -> list[GroupOutcome]:
        if list(group_ids) != list(range(group_ids[0], group_ids[0] + len(group_ids))):
            raise ValueError(f"strict rollouts need consecutive group ids, got {list(group_ids)}")
        by_group: dict[int, list[Trajectory]] = {group_id: [] for group_id in group_ids}
        for trajectory in rollout(rows, group_ids[0]):
            by_group[trajectory.group_id].append(trajectory)
        return [by_group[group_id] for group_id in group_ids]

    return run
