"""Collector: epoch cycling, leftover rows, weight-update modes, wakeups, failures, in-flight rows in state."""

import threading
import time

import pytest
from pipeline_fakes import FakeGenerator, GatedPrompts, ListPrompts, build, draw_ids_of, run_steps, wait_until

from asyncppo.pipeline.buffer import FAILED_ROLLOUT
from asyncppo.pipeline.errors import CollectorError, StallError, StepFillError


def test_collection_loop_cycles_multiple_epochs():
    # 4 rows, batches of 2, 2 prompts per step: every 2 steps is one epoch, 6 steps are 3 epochs.
    setup = build(ListPrompts(4, 2), FakeGenerator())
    try:
        run_steps(setup, range(6))
    finally:
        setup.source.close()
    for step, batch in setup.batches.items():
        assert draw_ids_of(batch) == [2 * step, 2 * step + 1]
        assert {trajectory.task["epoch"] for trajectory in batch.trajectories} == {step // 2}
    assert setup.source.accounting().problems == []


def test_collection_loop_recovers_from_exhausted_first_epoch_on_resume():
    # Restored at the very end of epoch 0: the first epoch yields nothing, which is not yet an error.
    setup = build(ListPrompts(4, 2), FakeGenerator())
    state = {"prompts": {"epoch": 0, "position": 4}, "pending": [], "next_draw_id": 0}
    setup.collector.load_state_dict({**state, "num_groups_completed": 0, "num_failed_rollouts": 0})
    try:
        batch = setup.source.next_batch(0)
    finally:
        setup.source.close()
    assert {trajectory.task["epoch"] for trajectory in batch.trajectories} == {1}


def test_collection_loop_stops_on_empty_dataset():
    setup = build(ListPrompts(0, 2), FakeGenerator(), watchdog_s=30.0)
    started = time.monotonic()
    try:
        with pytest.raises(CollectorError, match="no prompts in two consecutive epochs"):
            setup.source.next_batch(0)
    finally:
        setup.source.close()
    assert time.monotonic() - started < 5.0  # reported at once, long before the 30 s watchdog


def test_leftover_rows_of_a_drawn_batch_are_kept_not_discarded():
    # Batches of 3 rows for 2-prompt steps: every other batch leaves a row pending, and it trains next.
    setup = build(ListPrompts(9, 3), FakeGenerator())
    try:
        run_steps(setup, range(6))
        report = setup.source.accounting()
    finally:
        setup.source.close()
    assert [draw_ids_of(setup.batches[step]) for step in range(6)] == [[2 * s, 2 * s + 1] for s in range(6)]
    indexes = [t.task["index"] for step in range(6) for t in setup.batches[step].trajectories if t.sample_index == 0]
    assert sorted(indexes) == sorted([0, 1, 2, 3, 4, 5, 6, 7, 8, 0, 1, 2])  # epoch 0 whole, epoch 1 begun
    assert report.problems == [] and report.trained == [(0, 12)]


@pytest.mark.parametrize("raise_failures", [False, True], ids=["returned", "raised"])
def test_a_failing_rollout_reaches_the_driver_with_its_cause(raise_failures: bool):
    # Without a failure budget (0), the first failed group stops collection, returned or raised alike.
    setup = build(ListPrompts(100, 2), FakeGenerator(fail_on=frozenset({3}), raise_failures=raise_failures))
    try:
        with pytest.raises(CollectorError, match=r"could not be filled: 1 prompt group failed.*\(group 3\)") as raised:
            run_steps(setup, range(5))
        assert isinstance(raised.value.__cause__, StepFillError)
        assert isinstance(raised.value.__cause__.__cause__, RuntimeError)
        assert "boom on draw 3" in str(raised.value)
        with pytest.raises(CollectorError):  # it stays failed: every later call says so again
            setup.collector.raise_if_failed()
        assert setup.buffer.ledger.outcome(3) == f"dropped/{FAILED_ROLLOUT}"
        assert setup.source.accounting().problems == []
    finally:
        setup.source.close()


def test_drain_mode_waits_for_running_rollouts_before_a_weight_update():
    gate = threading.Event()
    setup = build(ListPrompts(100, 2), FakeGenerator(gate=gate), in_flight=False)
    setup.source.start()
    try:
        assert wait_until(lambda: len(setup.collector.in_flight_ids()) == 4)  # targets 0 and 1
        finished, release = threading.Event(), threading.Event()

        def update() -> None:
            with setup.source.weight_update(1):
                finished.set()
                release.wait(5.0)  # the push, held open while the test looks

        drainer = threading.Thread(target=update)
        drainer.start()
        assert not finished.wait(0.2)  # still draining
        gate.set()
        assert finished.wait(5.0)
        assert setup.collector.in_flight_ids() == []
        assert setup.buffer.size() == 4
        release.set()
        drainer.join(timeout=5.0)
    finally:
        gate.set()
        release.set()
        setup.source.close()


def test_in_flight_mode_only_pauses_starts_during_a_weight_update():
    # Target 1's rollouts (draws 2, 3) wait for the gate, so they are running when step 0 publishes its weights.
    gate = threading.Event()
    setup = build(ListPrompts(100, 2), FakeGenerator(gate=gate, gated=frozenset({2, 3})), in_flight=True)
    try:
        setup.source.next_batch(0)
        assert setup.collector.in_flight_ids() == [2, 3]
        with setup.source.weight_update(1):  # enters at once: nothing drains
            assert setup.collector.in_flight_ids() == [2, 3]  # still generating, now with the new weights
            setup.generator.version = 1
        gate.set()
        batch = setup.source.next_batch(1)
    finally:
        gate.set()
        setup.source.close()
    # Rollouts started on version 0 and finished on version 1: each trajectory spans the update.
    assert {(t.policy_version, t.last_policy_version) for t in batch.trajectories} == {(0, 1)}
    assert batch.metrics["async/max_trajectory_age"] == 1.0


def test_a_drain_that_never_ends_raises_stall_error_naming_the_rollouts():
    gate = threading.Event()
    setup = build(ListPrompts(100, 2), FakeGenerator(gate=gate), watchdog_s=0.3)
    setup.source.start()
    try:
        assert wait_until(lambda: len(setup.collector.in_flight_ids()) == 4)
        drain = setup.source.weight_update(1)
        with pytest.raises(StallError, match=r"4 rollouts still running .* \(draw ids \[0, 1, 2, 3\]\)"):
            drain.__enter__()
    finally:
        gate.set()
        setup.source.close()


def test_a_weight_version_change_wakes_the_collector_at_once():
    # idle_recheck_s = 30: only the notification from set_weight_version can wake it within the test.
    setup = build(ListPrompts(100, 2), FakeGenerator(), idle_recheck_s=30.0)
    try:
        setup.source.next_batch(0)
        with setup.source.weight_update(1):
            time.sleep(0.05)  # the collector is asleep: version 0's window [0, 1] is done
            assert not setup.buffer.is_covered(2)
            setup.generator.version = 1
        assert wait_until(lambda: setup.buffer.is_covered(2), timeout_s=2.0)
    finally:
        setup.source.close()


def test_state_dict_keeps_in_flight_and_leftover_rows_with_their_draw_ids():
    gate = threading.Event()
    setup = build(ListPrompts(100, 3), FakeGenerator(gate=gate))
    setup.source.start()
    try:
        assert wait_until(lambda: len(setup.collector.in_flight_ids()) == 4)
        state = setup.source.state_dict()
    finally:
        gate.set()
        setup.source.close()
    # Two batches of 3 were drawn for targets 0 and 1: draws 0-3 in flight, draws 4-5 left over.
    pending = state["collector"]["pending"]
    assert [entry["draw_id"] for entry in pending] == [0, 1, 2, 3, 4, 5]
    assert [entry["row"]["index"] for entry in pending] == [0, 1, 2, 3, 4, 5]
    assert state["collector"]["next_draw_id"] == 6 and state["buffer"]["groups"] == []
    resumed = build(ListPrompts(100, 3), FakeGenerator())
    resumed.source.load_state_dict(state)
    try:
        batch = resumed.source.next_batch(0)
    finally:
        resumed.source.close()
    assert draw_ids_of(batch) == [0, 1]
    assert sorted({t.task["index"] for t in batch.trajectories}) == [0, 1]


def test_a_slow_prompt_stream_does_not_block_the_driver_or_lose_rows():
    gate = threading.Event()
    gate.set()
    setup = build(GatedPrompts(100, 2, gate), FakeGenerator())
    try:
        setup.source.next_batch(0)  # targets 0 and 1 drawn
        gate.clear()  # the next draw (target 2, after the update) hangs in the stream
        with setup.source.weight_update(1):
            setup.generator.version = 1
        assert wait_until(lambda: "drawing prompts for" in setup.collector.describe())
        started = time.monotonic()
        assert setup.buffer.take(1, max_age=1) is not None  # wakes the collector without waiting for the draw
        assert time.monotonic() - started < 0.5
        saver = threading.Thread(target=setup.source.state_dict)
        saver.start()
        time.sleep(0.1)
        gate.set()  # the snapshot waited for the draw, so stream position and pending rows agree
        saver.join(timeout=5)
        assert not saver.is_alive()
    finally:
        gate.set()
        setup.source.close()
