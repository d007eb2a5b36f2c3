"""Failed prompt groups are dropped and replaced within the per-step budget, in both batch sources; past the
budget the run stops with a StepFillError naming the step, the count and the last failure."""

import pytest
from pipeline_fakes import FakeGenerator, ListPrompts, build, draw_ids_of, make_trajectory, run_steps

from asyncppo.pipeline.buffer import FAILED_ROLLOUT
from asyncppo.pipeline.errors import CollectorError, StepFillError
from asyncppo.pipeline.failures import StepFailureBudget
from asyncppo.pipeline.sources import GroupOutcome, SyncBatchSource, strict_group_rollouts

KEY = "env.gym.max_failed_groups_per_step"


class FlakyOutcomes:
    """A sync GroupRolloutsFn whose rows with an index in `fail_rows` fail (as values), recording every call."""

    def __init__(self, fail_rows: set[int]) -> None:
        self.fail_rows = fail_rows
        self.calls: list[list[int]] = []

    def __call__(self, rows, group_ids) -> list[GroupOutcome]:
        self.calls.append([row["index"] for row in rows])
        outcomes: list[GroupOutcome] = []
        for row, group_id in zip(rows, group_ids, strict=True):
            if row["index"] in self.fail_rows:
                outcomes.append(ConnectionError(f"agent dropped row {row['index']}"))
            else:
                outcomes.append([make_trajectory(group_id, sample, task=row) for sample in range(2)])
        return outcomes


def test_budget_counts_per_step_and_reports_past_its_limit():
    budget = StepFailureBudget(2, KEY)
    assert budget.record(5, 10, ValueError("a")) is None
    assert budget.record(5, 11, ValueError("b")) is None
    error = budget.record(5, 12, ValueError("c"))
    assert isinstance(error, StepFillError) and isinstance(error.__cause__, ValueError)
    # Step index 5 is the sixth step: messages number steps from 1, as the progress line and the metrics do.
    assert str(error).startswith("step 6 could not be filled: 3 prompt groups failed")
    assert f"{KEY}=2" in str(error) and "group 12" in str(error) and "ValueError: c" in str(error)
    budget.reset()
    assert budget.count == 0 and budget.total == 3
    with pytest.raises(ValueError, match=KEY):
        StepFailureBudget(-1, KEY)


def test_sync_source_replaces_failed_groups_with_fresh_prompts():
    rollout = FlakyOutcomes(fail_rows={1, 2})
    source = SyncBatchSource(
        ListPrompts(100, 4), rollout, num_prompts_per_step=4, failure_budget=StepFailureBudget(2, KEY)
    )
    batch = source.next_batch(0)
    assert batch.num_prompts == 4 and len(batch.trajectories) == 8
    assert sorted({t.task["index"] for t in batch.trajectories}) == [0, 3, 4, 5]
    assert batch.metrics["rollout/failed_groups"] == 2.0
    # The refill asked for exactly the two missing groups; rows 6 and 7 of that stream batch wait in pending.
    assert rollout.calls == [[0, 1, 2, 3], [4, 5]]
    # Group ids are draw ids: unique, in draw order, failed ones included.
    assert sorted({t.group_id for t in batch.trajectories}) == [0, 3, 4, 5]
    state = source.state_dict()
    assert [row["index"] for row in state["pending"]] == [6, 7]

    resumed = SyncBatchSource(
        ListPrompts(100, 4), FlakyOutcomes(set()), num_prompts_per_step=4, failure_budget=StepFailureBudget(2, KEY)
    )
    resumed.load_state_dict(state)
    following = source.next_batch(1)
    again = resumed.next_batch(1)
    assert [t.task["index"] for t in again.trajectories] == [t.task["index"] for t in following.trajectories]
    assert [t.group_id for t in again.trajectories] == [t.group_id for t in following.trajectories]
    assert following.metrics["rollout/failed_groups"] == 0.0  # the budget starts over every step
    # The books went with the state: both sources account every id drawn, failed groups as dropped.
    for books in (source.accounting(), resumed.accounting()):
        assert books.problems == [] and books.next_draw_id == 10
        assert books.trained == [(0, 1), (3, 10)] and books.dropped == {FAILED_ROLLOUT: [(1, 3)]}


def test_sync_source_books_a_raising_call_and_reseeds_through_its_callback():
    seeds: list[int] = []

    def rollout(rows, group_ids):
        raise ConnectionError("engine gone")

    source = SyncBatchSource(
        ListPrompts(100, 4),
        rollout,
        num_prompts_per_step=4,
        failure_budget=StepFailureBudget(2, KEY),
        reseed=seeds.append,
    )
    source.reseed_generation(11)
    assert seeds == [11]
    with pytest.raises(ConnectionError, match="engine gone"):
        source.next_batch(0)  # a raised call is not a group failure to replace: it ends the step
    books = source.accounting()
    assert books.problems == [] and books.dropped == {FAILED_ROLLOUT: [(0, 4)]}
    with source.weight_update(1):  # nothing runs while weights change
        pass


def test_a_sync_checkpoint_without_books_counts_every_earlier_group_as_trained():
    source = SyncBatchSource(
        ListPrompts(100, 4), FlakyOutcomes(set()), num_prompts_per_step=4, failure_budget=StepFailureBudget(0, KEY)
    )
    source.load_state_dict({"prompts": {"epoch": 0, "position": 8}, "next_group_id": 8, "pending": []})
    source.next_batch(2)
    assert source.accounting().trained == [(0, 12)] and source.accounting().problems == []


def test_sync_source_stops_with_a_clear_error_when_a_step_cannot_be_filled():
    rollout = FlakyOutcomes(fail_rows=set(range(100)))
    source = SyncBatchSource(
        ListPrompts(100, 4), rollout, num_prompts_per_step=4, failure_budget=StepFailureBudget(3, KEY)
    )
    with pytest.raises(StepFillError, match=r"step 1 could not be filled: 4 prompt groups failed") as raised:
        source.next_batch(0)
    assert isinstance(raised.value.__cause__, ConnectionError)
    assert "agent dropped row 3" in str(raised.value)


def test_strict_rollouts_keep_the_one_call_batch_and_split_groups():
    calls = []

    def rollout(rows, group_id_start):
        calls.append(group_id_start)
        return [make_trajectory(group_id_start + i, s) for i in range(len(rows)) for s in range(2)]

    outcomes = strict_group_rollouts(rollout)([{"index": 0}, {"index": 1}], [7, 8])
    assert calls == [7]
    assert [[t.group_id for t in group] for group in outcomes] == [[7, 7], [8, 8]]  # type: ignore[union-attr]


def test_async_collector_drops_a_failed_group_and_fills_its_target_with_a_fresh_prompt():
    setup = build(
        ListPrompts(100, 2), FakeGenerator(fail_on=frozenset({1, 4})), failure_budget=StepFailureBudget(4, KEY)
    )
    try:
        run_steps(setup, range(4))
    finally:
        setup.source.close()
    trained = [draw for step in range(4) for draw in draw_ids_of(setup.batches[step])]
    assert 1 not in trained and 4 not in trained
    assert all(setup.batches[step].num_prompts == 2 for step in range(4))
    assert sum(setup.batches[step].metrics["rollout/failed_groups"] for step in range(4)) == 2.0
    assert setup.buffer.ledger.outcome(1) == f"dropped/{FAILED_ROLLOUT}"
    assert setup.source.accounting().problems == []


def test_async_collector_stops_with_step_fill_error_past_the_budget():
    setup = build(
        ListPrompts(100, 2), FakeGenerator(fail_on=frozenset(range(100))), failure_budget=StepFailureBudget(2, KEY)
    )
    try:
        with pytest.raises(CollectorError, match="could not be filled: 3 prompt groups failed") as raised:
            run_steps(setup, range(2))
        assert isinstance(raised.value.__cause__, StepFillError)
    finally:
        setup.source.close()
