"""Batch sources: where the driver's training step gets its trajectories from (the seam between sync and async).

    prompts --(sync: generate now, with the current weights)--> StepBatch --> driver step
    prompts --collector --> TrajectoryBuffer --(async: take(step))--> StepBatch --> driver step

The driver only knows `BatchSource`: each step's batch, the weight-update context around every publish, the
sampling reseed, the books of every prompt drawn (accounting) and the resumable state; a checkpoint takes the
last two together (`snapshot`), so its books describe exactly the state it resumes from. Sync and async PPO
differ in which source it is handed, never in what the driver does.

Both sources call one rollout type, `GroupRolloutFn`, with one failure contract: a prompt group whose rollout
failed (after the rollout's own retries) comes back as its exception, and the source drops and replaces it
within the step's `StepFailureBudget` (a budget of 0: the first failure ends the run); an exception the call
raises is a failure of every group it was given. Groups that failed because a generator process died while they
were in flight (`GenerationHealth` says so) are neither: they run again once the generators serve, with the same
group ids, and the books never see them.
"""

from collections import deque
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from typing import Any, Protocol

from asyncppo.pipeline.buffer import FAILED_ROLLOUT
from asyncppo.pipeline.dynamic_sampling import DynamicSampling, fill_with_varied_groups
from asyncppo.pipeline.errors import GenerationInterrupted, step_number
from asyncppo.pipeline.failures import StepFailureBudget
from asyncppo.pipeline.ledger import AccountingLedger, AccountingReport, find_accounting_problems
from asyncppo.types import Trajectory

Row = dict[str, Any]
RolloutFn = Callable[[Sequence[Row], int], list[Trajectory]]
"""(prompt rows, first group id) -> trajectories of every prompt's group, group ids consecutive from there;
raises on any failure (strict_group_rollouts makes it a GroupRolloutFn)."""
GroupOutcome = list[Trajectory] | Exception
"""One prompt group's trajectories, or the exception that ended its rollout (after the rollout's own retries)."""
GroupRolloutFn = Callable[[Sequence[Row], Sequence[int]], list[GroupOutcome]]
"""(prompt rows, their group ids) -> one outcome per row, in order; a group's failure is its outcome, and each
trajectory's group_id is its row's group id."""


@dataclass
class StepBatch:
    """The trajectories of one training step and what the source reports about producing them."""

    trajectories: list[Trajectory]
    num_prompts: int
    metrics: dict[str, float] = field(default_factory=dict[str, float])


@dataclass(frozen=True)
class SourceSnapshot:
    """A batch source's resumable state and its books, taken at one instant: a draw id the state holds as pending
    is pending in the accounting too, never buffered in one and pending in the other."""

    state: dict[str, Any]
    accounting: AccountingReport


class PromptBatches(Protocol):
    """A resumable stream of prompt batches (data.prompt_stream.PromptStream satisfies it)."""

    def __iter__(self) -> Iterator[list[Row]]: ...

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...


class GenerationHealth(Protocol):
    """Whether the generators serve, as the sources see it (`workers/generator_supervisor.py` answers): a generator
    process that dies is restarted, and the rollouts it cost are run again instead of counted as failures."""

    def deaths(self) -> int:
        """Generator deaths noticed so far: a mark taken when a rollout starts."""
        ...

    def lost_requests_since(self, deaths: int) -> bool:
        """Whether a generator died since the mark `deaths` or is being restarted now (dead processes not noticed
        yet are looked for first): a rollout started at that mark that failed may have lost its requests."""
        ...

    def serving(self) -> bool:
        """Every generator is up with the published weights (no restart in progress)."""
        ...

    def failure(self) -> Exception | None:
        """The error that ended generation for good (restarts ran out, a trainer process died), if any."""
        ...

    def wait_until_serving(self) -> None:
        """Block until `serving()`; raises `failure()` if generation ends for good meanwhile."""
        ...


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

    def weight_update(self, version: int) -> AbstractContextManager[None]:
        """The driver publishes weight `version` inside this context (async: rollouts pause or drain on entry;
        on a clean exit the staleness window moves to `version` and collection resumes)."""
        ...

    def reseed_generation(self, seed: int) -> None:
        """Set the generators' sampling seed before a step's or a validation's rollouts, where that makes them
        reproducible (sync); a source whose rollouts run at timing-dependent points leaves the engines alone."""
        ...

    def accounting(self) -> AccountingReport:
        """Where every prompt drawn so far is: trained, dropped with a reason, buffered or pending."""
        ...

    def snapshot(self) -> SourceSnapshot:
        """state_dict() and accounting() from one instant (background work held still meanwhile), for checkpoints."""
        ...


class SyncBatchSource:
    """Generates each step's batch on demand with the weights the generators hold now (sync PPO).

    `rollout` answers each row with its group or the exception that ended it. A failed group is dropped and a
    fresh prompt takes its place (the rows a refill draws beyond its need wait in `pending`, checkpointed),
    until the step's failure budget runs out: then StepFillError. Group ids are draw ids, one per row drawn;
    the books record each as trained (handed to the step) or dropped as a failed rollout.
    `reseed` sets the generators' sampling seed (each step's rollouts then do not depend on earlier steps').
    With `health`, groups a generator's death cost are run again (same group ids) once the generators serve.
    With `dynamic_sampling` the step is filled from whole generation batches and keeps only groups whose rewards
    differ (`pipeline/dynamic_sampling.py`; its filtered and unused groups are dropped with their reasons).
    """

    def __init__(
        self,
        prompts: PromptBatches,
        rollout: GroupRolloutFn,
        *,
        num_prompts_per_step: int,
        failure_budget: StepFailureBudget,
        reseed: Callable[[int], None] | None = None,
        dynamic_sampling: DynamicSampling | None = None,
        health: GenerationHealth | None = None,
    ):
        self._prompts = prompts
        self._rollout = rollout
        self._num_prompts = num_prompts_per_step
        self._failures = failure_budget
        self._reseed = reseed
        self._dynamic_sampling = dynamic_sampling
        self._health = health
        self._iterator: Iterator[list[Row]] | None = None
        self._pending: deque[Row] = deque()
        self._next_group_id = 0
        self._ledger = AccountingLedger()

    def next_batch(self, step: int) -> StepBatch:
        self._failures.reset()
        metrics: dict[str, float] = {}
        if self._dynamic_sampling is None:
            groups = self._generate_groups(step, self._num_prompts)
        else:
            groups, metrics = fill_with_varied_groups(
                step,
                self._num_prompts,
                self._dynamic_sampling,
                lambda count: self._generate_groups(step, count),
                self._ledger,
            )
        self._ledger.record_trained(group[0].group_id for group in groups)
        trajectories = [trajectory for group in groups for trajectory in group]
        metrics["rollout/failed_groups"] = float(self._failures.count)
        return StepBatch(trajectories=trajectories, num_prompts=len(groups), metrics=metrics)

    def _generate_groups(self, step: int, count: int) -> list[list[Trajectory]]:
        """`count` rolled-out groups of freshly drawn prompts, in draw order; failed groups are recorded dropped
        and replaced within the step's failure budget."""
        groups: list[list[Trajectory]] = []
        while len(groups) < count:
            rows = self._draw(step, count - len(groups))
            group_ids = list(range(self._next_group_id, self._next_group_id + len(rows)))
            self._next_group_id += len(rows)
            try:
                outcomes = self._roll_out(rows, group_ids)
            except Exception:
                # The call failed as a whole: its groups are lost with the run, and the books say so.
                self._ledger.record_dropped(group_ids, FAILED_ROLLOUT)
                raise
            for group_id, outcome in zip(group_ids, outcomes, strict=True):
                if not isinstance(outcome, Exception):
                    groups.append(outcome)
                    continue
                self._ledger.record_dropped([group_id], FAILED_ROLLOUT)
                error = self._failures.record(step, group_id, outcome)
                if error is not None:
                    raise error
        return groups

    def _roll_out(self, rows: Sequence[Row], group_ids: Sequence[int]) -> list[GroupOutcome]:
        """The rollout's outcomes, with the groups a generator's death cost run again (same ids) once the generators
        serve: the call when it raised GenerationInterrupted, else each run of consecutive failed groups."""
        health = self._health
        while True:
            mark = health.deaths() if health is not None else 0
            try:
                outcomes = self._rollout(rows, group_ids)
            except GenerationInterrupted:
                if health is None:
                    raise
                health.wait_until_serving()
                continue
            if len(outcomes) != len(rows):
                raise ValueError(f"rollout answered {len(outcomes)} outcomes for {len(rows)} rows")
            failed = [index for index, outcome in enumerate(outcomes) if isinstance(outcome, Exception)]
            if health is None or not failed or not health.lost_requests_since(mark):
                return outcomes
            health.wait_until_serving()
            for run in consecutive_runs(failed):  # rollouts may require consecutive group ids
                rerun = self._roll_out([rows[index] for index in run], [group_ids[index] for index in run])
                for index, outcome in zip(run, rerun, strict=True):
                    outcomes[index] = outcome
            return outcomes

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
            raise RuntimeError(
                f"the training data ran out while filling step {step_number(step)} (ppo.max_num_epochs reached)"
            ) from None

    def state_dict(self) -> dict[str, Any]:
        return {
            "prompts": self._prompts.state_dict(),
            "next_group_id": self._next_group_id,
            "pending": list(self._pending),
            "ledger": self._ledger.state_dict(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._prompts.load_state_dict(state["prompts"])
        self._next_group_id = int(state["next_group_id"])
        self._pending = deque(dict(row) for row in state.get("pending", []))
        self._iterator = None
        self._ledger = AccountingLedger()
        if "ledger" in state:
            self._ledger.load_state_dict(state["ledger"])
        elif self._next_group_id > 0:
            # A checkpoint written before sync runs kept books: without a failure budget (the only sync setting
            # that existed then for single-turn runs) every group drawn before it was trained.
            self._ledger.record_trained(range(self._next_group_id))

    def snapshot(self) -> SourceSnapshot:
        # Nothing runs between steps, so two reads in a row see one instant.
        return SourceSnapshot(state=self.state_dict(), accounting=self.accounting())

    def close(self) -> None:
        return None

    def weight_update(self, version: int) -> AbstractContextManager[None]:
        return nullcontext()  # batches are generated on demand, so nothing runs while weights change

    def reseed_generation(self, seed: int) -> None:
        if self._reseed is not None:
            self._reseed(seed)

    def accounting(self) -> AccountingReport:
        """Drawn ids are trained or dropped by the time next_batch returns; the pending rows have no id yet."""
        return AccountingReport(
            trained=self._ledger.trained.ranges(),
            dropped={reason: ids.ranges() for reason, ids in self._ledger.dropped.items()},
            buffered=[],
            pending=[],
            next_draw_id=self._next_group_id,
            problems=find_accounting_problems(self._ledger, [], [], self._next_group_id),
        )


def consecutive_runs(indices: Sequence[int]) -> list[list[int]]:
    """Sorted `indices` cut into runs of consecutive numbers: [1, 2, 4] -> [[1, 2], [4]]."""
    runs: list[list[int]] = []
    for index in indices:
        if runs and index == runs[-1][-1] + 1:
            runs[-1].append(index)
        else:
            runs.append([index])
    return runs


def strict_group_rollouts(rollout: RolloutFn) -> GroupRolloutFn:
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
