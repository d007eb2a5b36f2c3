"""The sources when a generator process dies (GenerationHealth): the prompt groups it cost run again under their
own draw ids once the generators serve, so the books never see them (no prompt lost, none trained twice, the
failure budget untouched); no rollout starts while a generator is being restarted; a run-ending failure reaches
the driver as it is. The generators here are fakes; tests/integration/test_generator_restart.py kills real ones."""

import threading
from collections.abc import Sequence

import pytest
from pipeline_fakes import FakeGenerator, ListPrompts, build, draw_ids_of, make_trajectory, run_steps, wait_until

from asyncppo.pipeline.errors import GenerationInterrupted, RunEndingError, StepFillError
from asyncppo.pipeline.failures import StepFailureBudget
from asyncppo.pipeline.sources import GroupOutcome, Row, SyncBatchSource, consecutive_runs
from asyncppo.pipeline.time_tally import GENERATOR_RESTART_WAIT

KEY = "max_failed_groups_per_step"


class FakeHealth:
    """GenerationHealth as a test sets it: deaths counted, serving or not, a run-ending failure or none."""

    def __init__(self) -> None:
        self.condition = threading.Condition()
        self.num_deaths = 0
        self.up = True
        self.ended: Exception | None = None
        self.waits = 0

    def die(self) -> None:
        """A generator died and is being restarted."""
        with self.condition:
            self.num_deaths += 1
            self.up = False

    def come_back(self) -> None:
        with self.condition:
            self.up = True
            self.condition.notify_all()

    def deaths(self) -> int:
        with self.condition:
            return self.num_deaths

    def lost_requests_since(self, deaths: int) -> bool:
        with self.condition:
            return self.num_deaths > deaths or not self.up

    def serving(self) -> bool:
        with self.condition:
            return self.up

    def failure(self) -> Exception | None:
        with self.condition:
            return self.ended

    def wait_until_serving(self) -> None:
        with self.condition:
            self.waits += 1
            assert self.condition.wait_for(lambda: self.up or self.ended is not None, timeout=10)
            if self.ended is not None:
                raise self.ended


class DyingOnce:
    """Rollouts where the first attempt at each draw in `dies_on` meets a generator's death: the call raises
    GenerationInterrupted (single-turn: the generate call itself fails), or, with `as_outcome`, the group comes back
    as an ordinary failure (gym: the agent's HTTP call to the dead policy server failed). The generator is back a
    moment later (`restart_s`); every call's (rows, ids) is recorded."""

    def __init__(
        self, health: FakeHealth, dies_on: set[int], as_outcome: bool = False, restart_s: float = 0.05
    ) -> None:
        self.health = health
        self.dies_on = set(dies_on)
        self.as_outcome = as_outcome
        self.restart_s = restart_s
        self.calls: list[list[int]] = []
        self.lock = threading.Lock()

    def __call__(self, rows: Sequence[Row], group_ids: Sequence[int]) -> list[GroupOutcome]:
        with self.lock:
            self.calls.append(list(group_ids))
            dying = [group_id for group_id in group_ids if group_id in self.dies_on]
            self.dies_on -= set(dying)
        if dying:
            self.health.die()
            threading.Timer(self.restart_s, self.health.come_back).start()
            if not self.as_outcome:
                raise GenerationInterrupted(f"generator died under groups {dying}")
        return [
            ConnectionError(f"policy server gone (group {group_id})")
            if group_id in dying
            else [make_trajectory(group_id, sample, task=row) for sample in range(2)]
            for row, group_id in zip(rows, group_ids, strict=True)
        ]


@pytest.mark.parametrize("as_outcome", [False, True], ids=["generate raised", "groups failed"])
def test_async_groups_a_generator_death_cost_run_again_under_their_draw_ids(as_outcome: bool):
    health = FakeHealth()
    rollout = DyingOnce(health, dies_on={3, 5}, as_outcome=as_outcome)
    generator = FakeGenerator()
    # Failure budget 0: one group counted as failed would end the run.
    setup = build(ListPrompts(100, 2), generator, rollout=rollout, health=health, idle_recheck_s=0.05)
    try:
        run_steps(setup, range(5))
        trained = [draw_id for step in range(5) for draw_id in draw_ids_of(setup.batches[step])]
        assert sorted(trained) == list(range(10))  # draws 3 and 5 trained once, under their own ids
        assert setup.collector.num_rerun_rollouts == 2
        assert [call for call in rollout.calls if call[0] in (3, 5)] == [[3], [3], [5], [5]]
        books = setup.source.accounting()
        assert books.problems == [] and books.dropped == {} and books.trained[0] == (0, 10)
        assert all(setup.batches[step].metrics["rollout/failed_groups"] == 0.0 for step in range(5))
        assert setup.batches[4].metrics["async/rerun_groups"] == 2.0
    finally:
        setup.source.close()


def test_an_ordinary_failure_without_a_death_still_counts_against_the_budget():
    health = FakeHealth()
    setup = build(ListPrompts(100, 2), FakeGenerator(fail_on=frozenset({3})), health=health)
    try:
        with pytest.raises(Exception, match="could not be filled") as raised:
            run_steps(setup, range(5))
        assert isinstance(raised.value.__cause__, StepFillError)
        assert setup.collector.num_rerun_rollouts == 0
    finally:
        setup.source.close()


def test_no_rollout_starts_while_a_generator_is_being_restarted():
    health = FakeHealth()
    health.die()
    setup = build(ListPrompts(100, 2), FakeGenerator(), idle_recheck_s=0.02, health=health)
    setup.source.start()
    try:
        assert not wait_until(lambda: setup.generator.started != [], timeout_s=0.3)
        health.come_back()
        assert wait_until(lambda: len(setup.generator.started) >= 2)
        run_steps(setup, range(2))
        assert setup.batches[0].metrics[f"async/{GENERATOR_RESTART_WAIT}"] > 0.2
    finally:
        setup.source.close()


def test_a_run_ending_failure_reaches_the_driver_as_it_is():
    health = FakeHealth()
    ended = RunEndingError("the generator worker (rank 0, pid 7) died during step 1: its process ended")
    health.ended = ended
    setup = build(ListPrompts(100, 2), FakeGenerator(), health=health)
    try:
        with pytest.raises(RunEndingError) as raised:
            setup.source.next_batch(0)
        assert raised.value is ended  # not wrapped in a CollectorError: its one line is the run's last
    finally:
        setup.source.close()


def test_sync_source_runs_again_what_a_generator_death_cost_and_the_books_never_see_it():
    health = FakeHealth()
    raised = DyingOnce(health, dies_on={1})  # the whole call raises: all four groups run again
    source = SyncBatchSource(
        ListPrompts(100, 4), raised, num_prompts_per_step=4, failure_budget=StepFailureBudget(0, KEY), health=health
    )
    batch = source.next_batch(0)
    assert raised.calls == [[0, 1, 2, 3], [0, 1, 2, 3]] and health.waits == 1
    assert sorted({t.group_id for t in batch.trajectories}) == [0, 1, 2, 3]
    assert source.accounting().trained == [(0, 4)] and source.accounting().dropped == {}

    failed = DyingOnce(health, dies_on={5, 6, 8}, as_outcome=True)  # gym: only the failed groups run again
    source = SyncBatchSource(
        ListPrompts(100, 4), failed, num_prompts_per_step=4, failure_budget=StepFailureBudget(0, KEY), health=health
    )
    for step in range(3):
        source.next_batch(step)
    # Runs of consecutive ids go together (single-turn rollouts need them): 5 and 6 in one call, 8 in another.
    assert failed.calls == [[0, 1, 2, 3], [4, 5, 6, 7], [5, 6], [8, 9, 10, 11], [8]]
    books = source.accounting()
    assert books.problems == [] and books.trained == [(0, 12)] and books.dropped == {}


def test_consecutive_runs_cut_sorted_indices_where_they_skip():
    assert consecutive_runs([1, 2, 4, 5, 6, 9]) == [[1, 2], [4, 5, 6], [9]]
    assert consecutive_runs([]) == []
