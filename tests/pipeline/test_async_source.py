"""AsyncBatchSource: the N+1 rule (#3828), the stall watchdog, step checks, metrics, a long random run and
snapshots whose books agree with their state."""

import random
import threading

import pytest
from pipeline_fakes import (
    FakeGenerator,
    GatedPrompts,
    ListPrompts,
    build,
    draw_ids_of,
    random_delay,
    run_steps,
    wait_until,
)

from asyncppo.config.ppo import AsyncPPOConfig
from asyncppo.pipeline.async_source import build_async_source
from asyncppo.pipeline.buffer import DROP_REASONS
from asyncppo.pipeline.errors import StallError
from asyncppo.pipeline.failures import StepFailureBudget
from asyncppo.pipeline.staleness import AgeSchedule
from asyncppo.pipeline.time_tally import COLLECTOR_TIME_REASONS


def test_startup_after_resume_needs_target_n_plus_1_covered_not_only_n():
    # A checkpoint with target 3 complete and target 4 not even reserved: taken after step 2 drained its
    # rollouts and before version 3 was published (version 2's window is [3]).
    first = build(ListPrompts(100, 2), FakeGenerator())
    try:
        run_steps(first, range(2))
        first.source.next_batch(2)
        with first.source.weight_update(3):
            assert first.buffer.needed(3) == 0 and first.buffer.needed(4) == 2 and first.buffer.size() == 2
            state = first.source.state_dict()
    finally:
        first.source.close()
    # Resume at 3 with a stalled prompt stream: target 3 is in the buffer, target 4 cannot be reserved yet.
    gate = threading.Event()
    resumed = build(GatedPrompts(100, 2, gate), FakeGenerator(), start_step=3)
    resumed.source.load_state_dict(state)
    returned = threading.Event()
    result: list[object] = []
    trainer = threading.Thread(target=lambda: (result.append(resumed.source.next_batch(3)), returned.set()))
    try:
        trainer.start()
        # Training 3 now would publish version 3 + 1, whose window starts at 5: target 4 would have no producer.
        assert resumed.ages.collectable_targets(4, initial_version=3) == [5]
        assert not returned.wait(0.3)
        assert resumed.buffer.size() == 0  # target 3 was taken; the wait is for target 4
        gate.set()
        assert returned.wait(5.0)
        assert resumed.buffer.is_covered(4)
        with resumed.source.weight_update(4):
            resumed.generator.version = 4
        run_steps(resumed, range(4, 6))  # and the run goes on past the restored boundary
    finally:
        gate.set()
        trainer.join(timeout=5)
        resumed.source.close()
    assert draw_ids_of(resumed.batches[4]) == [8, 9]


def test_a_stall_raises_stall_error_naming_the_target_and_the_buffer():
    gate = threading.Event()  # never set: rollouts hang (the fake gives up after 10 s)
    setup = build(ListPrompts(100, 2), FakeGenerator(gate=gate), watchdog_s=0.3)
    try:
        with pytest.raises(StallError) as raised:
            setup.source.next_batch(0)
    finally:
        gate.set()
        setup.source.close()
    message = str(raised.value)
    assert "step 1 (buffer target 0): no progress for" in message
    assert "waiting for target 0: 2 complete groups" in message
    assert "reserved (in flight) by target: {0: 2, 1: 2}" in message
    assert "4 rollouts in flight" in message


def test_a_stall_before_step_n_plus_1_is_covered_names_that_target():
    gate = threading.Event()
    gate.set()
    setup = build(GatedPrompts(100, 2, gate), FakeGenerator(), watchdog_s=0.3)
    try:
        run_steps(setup, range(1))
        gate.clear()  # target 2 can never be drawn
        with pytest.raises(StallError, match="waiting for target 2 to be covered"):
            setup.source.next_batch(1)
    finally:
        gate.set()
        setup.source.close()


def test_steps_must_follow_the_collector_version():
    setup = build(ListPrompts(100, 2), FakeGenerator())
    try:
        with pytest.raises(ValueError, match="expected step 0"):
            setup.source.next_batch(1)
        setup.source.next_batch(0)
        with pytest.raises(ValueError, match=r"inside weight_update\(1\) first"):
            setup.source.next_batch(1)
    finally:
        setup.source.close()


def test_batch_metrics_report_ages_buffer_and_drops():
    ages = AgeSchedule(policy_training_start_step=1, train_age=1, warmup_age=2)
    setup = build(ListPrompts(100, 2), FakeGenerator(), ages=ages)
    try:
        setup.source.start()
        # Version 0 (pi_0, warmup lead 2) banks targets 0..2; wait for it so step 2's batch is version-0 data.
        assert wait_until(lambda: setup.buffer.is_covered(2))
        run_steps(setup, range(4))
    finally:
        setup.source.close()
    expected = {
        "async/buffer_size",
        "async/avg_trajectory_age",
        "async/max_trajectory_age",
        "async/avg_policy_age",
        "async/max_policy_age",
        "async/idle/buffer_starvation",
        *(f"async/{reason}" for reason in COLLECTOR_TIME_REASONS),
        "async/failed_trajectories",
        "async/rerun_groups",
        "async/collector_groups_per_second",
        "rollout/failed_groups",
    } | {f"async/dropped_prompts/{reason}" for reason in DROP_REASONS}
    for step, batch in setup.batches.items():
        assert set(batch.metrics) == expected
        assert batch.num_prompts == 2 and len(batch.trajectories) == 4
        # Age from the versions the fake stamped: step - policy_version, freeze-aware with W = 1.
        versions = [t.policy_version for t in batch.trajectories]
        assert batch.metrics["async/max_trajectory_age"] == max(step - v for v in versions)
        assert batch.metrics["async/max_policy_age"] == max(ages.policy_age(step, v) for v in versions)
    # Step 2 trains version-0 data: age 2, and policy age max(0, 2 - 1) - max(0, 0 - 1) = 1.
    assert setup.batches[2].metrics["async/max_trajectory_age"] == 2.0
    assert setup.batches[2].metrics["async/max_policy_age"] == 1.0


@pytest.mark.parametrize(
    ("in_flight", "start", "train_age", "warmup_age", "max_concurrent", "seed"),
    [
        (False, 0, 1, 1, 8, 0),
        (True, 2, 1, 3, 3, 1),
        (True, 3, 2, 4, 16, 2),
        (False, 2, 2, 2, 2, 3),
        (True, 4, 3, 1, 5, 4),  # warmup age below the train age: non-monotone eviction boundary
    ],
)
def test_long_random_run_never_exceeds_the_staleness_window(
    in_flight: bool, start: int, train_age: int, warmup_age: int, max_concurrent: int, seed: int
):
    rng = random.Random(seed)
    ages = AgeSchedule(policy_training_start_step=start, train_age=train_age, warmup_age=warmup_age)
    generator = FakeGenerator(group_size=2, delay=random_delay(seed, 0.004))
    setup = build(
        ListPrompts(17, 4), generator, num_prompts=3, ages=ages, in_flight=in_flight, max_concurrent=max_concurrent
    )
    try:
        run_steps(setup, range(25), rng=rng, max_pause_s=0.003)
        report = setup.source.accounting()
    finally:
        setup.source.close()
    seen: list[int] = []
    for step, batch in setup.batches.items():
        assert batch.metrics["async/max_policy_age"] <= train_age
        for trajectory in batch.trajectories:
            assert ages.policy_age(step, trajectory.policy_version) <= train_age
            assert step - trajectory.policy_version <= ages.sample_max_age(step)
            assert trajectory.policy_version <= trajectory.last_policy_version <= step
            if not in_flight:
                assert trajectory.last_policy_version == trajectory.policy_version
        seen += draw_ids_of(batch)
    assert len(seen) == len(set(seen)) == 75
    assert report.problems == []
    assert sorted(seen) == [draw_id for start_id, end_id in report.trained for draw_id in range(start_id, end_id)]


def test_build_async_source_wires_the_pieces_from_the_async_section():
    generator = FakeGenerator()
    settings = AsyncPPOConfig(
        enabled=True,
        max_trajectory_age_steps=1,
        warmup_max_trajectory_age_steps=None,  # null: the train age
        in_flight_weight_updates=True,
        drop_incomplete_targets_on_restore=True,
        watchdog_timeout_s=5.0,
    )
    source = build_async_source(
        ListPrompts(100, 2),
        generator.rollout,
        settings,
        num_prompts_per_step=2,
        start_step=0,
        policy_training_start_step=1,
        failure_budget=StepFailureBudget(0, "max_failed_groups_per_step"),
    )
    try:
        for step in range(3):
            batch = source.next_batch(step)
            assert draw_ids_of(batch) == [2 * step, 2 * step + 1]
            with source.weight_update(step + 1):
                generator.version = step + 1
    finally:
        source.close()


def test_a_snapshot_s_books_agree_with_its_state_while_the_collector_runs():
    # The driver trains steps on its thread while groups complete every few ms; state and books read at
    # different moments would put a group completing in between in the state's pending rows and in the books'
    # buffered ids (3 of 11 real checkpoints did).
    setup = build(ListPrompts(10_000, 2), FakeGenerator(delay=random_delay(0, 0.004)), max_concurrent=8)
    driver = threading.Thread(target=run_steps, args=(setup, range(40)), daemon=True)
    num_snapshots = 0
    try:
        setup.source.start()
        driver.start()
        while driver.is_alive():
            snapshot = setup.source.snapshot()
            state, books = snapshot.state, snapshot.accounting
            assert books.pending == [entry["draw_id"] for entry in state["collector"]["pending"]]
            assert books.buffered == [group["draw_id"] for group in state["buffer"]["groups"]]
            assert books.next_draw_id == state["collector"]["next_draw_id"]
            assert books.problems == []
            num_snapshots += 1
    finally:
        driver.join(timeout=30)
        setup.source.close()
    assert len(setup.batches) == 40 and num_snapshots >= 20
