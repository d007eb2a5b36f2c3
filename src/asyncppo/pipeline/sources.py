"""Batch sources: where the driver's training step gets its trajectories from (the seam between sync and async).

    prompts --(sync: generate now, with the current weights)--> StepBatch --> driver step
    prompts --collector --> TrajectoryBuffer --(async: take(step))--> StepBatch --> driver step

The driver only knows `BatchSource`; sync and async PPO differ in which source it is handed.
"""

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from asyncppo.rollout.trajectory import Trajectory

Row = dict[str, Any]
RolloutFn = Callable[[Sequence[Row], int], list[Trajectory]]
"""(prompt rows, first group id) -> trajectories of every prompt's group, group ids consecutive from there."""


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
    """Generates each step's batch on demand with the weights the generators hold now (sync PPO)."""

    def __init__(self, prompts: PromptBatches, rollout: RolloutFn):
        self._prompts = prompts
        self._rollout = rollout
        self._iterator: Iterator[list[Row]] | None = None
        self._next_group_id = 0

    def next_batch(self, step: int) -> StepBatch:
        if self._iterator is None:
            self._iterator = iter(self._prompts)
        try:
            rows = next(self._iterator)
        except StopIteration:
            raise RuntimeError(f"the training data ran out before step {step} (ppo.max_num_epochs reached)") from None
        trajectories = self._rollout(rows, self._next_group_id)
        self._next_group_id += len(rows)
        return StepBatch(trajectories=trajectories, num_prompts=len(rows))

    def state_dict(self) -> dict[str, Any]:
        return {"prompts": self._prompts.state_dict(), "next_group_id": self._next_group_id}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._prompts.load_state_dict(state["prompts"])
        self._next_group_id = int(state["next_group_id"])
        self._iterator = None

    def close(self) -> None:
        return None

    def before_weight_update(self) -> None:
        return None  # batches are generated on demand, so nothing runs while weights change

    def after_weight_update(self, version: int) -> None:
        return None
