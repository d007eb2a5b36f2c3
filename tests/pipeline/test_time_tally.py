"""Where async time goes: the TimeTally, the collector's idle reasons and wasted seconds, the driver's breakdown."""

import time

import pytest
from pipeline_fakes import FakeGenerator, ListPrompts, build, wait_until

from asyncppo.pipeline.failures import StepFailureBudget
from asyncppo.pipeline.staleness import AgeSchedule
from asyncppo.pipeline.time_tally import (
    BUFFER_FULL_BACKOFF,
    COLLECTOR_TIME_REASONS,
    FAILED_TRAJECTORY,
    GENERATION_LIMIT_PAUSE,
    REFIT_EVENT_WAIT,
    TimeTally,
    driver_idle_breakdown,
)

WAIT_S = 0.3
# The loop books a wait when it ends (every idle_recheck_s = 0.05 s here), so a window of WAIT_S holds about WAIT_S
# give or take one recheck; the bounds below leave room for a loaded machine's late wake-ups.


def test_tally_sums_per_reason_and_take_starts_over():
    tally = TimeTally(["idle/a", "idle/b"])
    tally.add("idle/a", 1.5)
    tally.add("idle/a", 0.25)
    assert tally.take() == {"idle/a": 1.75, "idle/b": 0.0}
    assert tally.take() == {"idle/a": 0.0, "idle/b": 0.0}


def test_tally_rejects_unknown_reasons_and_negative_seconds():
    tally = TimeTally(["idle/a"])
    with pytest.raises(ValueError, match=r"unknown time reason 'idle/x'"):
        tally.add("idle/x", 1.0)
    with pytest.raises(ValueError, match=r"must be >= 0, got -1.0"):
        tally.add("idle/a", -1.0)


def idle_after(setup, settle) -> dict[str, float]:
    """The collector's tally over WAIT_S seconds once `settle()` holds (what came before is discarded)."""
    setup.source.start()
    assert wait_until(settle)
    setup.collector.time_tally.take()
    time.sleep(WAIT_S)
    return setup.collector.time_tally.take()


def others_are_zero(times: dict[str, float], reason: str) -> bool:
    return all(seconds == 0.0 for other, seconds in times.items() if other != reason)


def test_a_collector_whose_window_is_covered_waits_for_the_generation_limit():
    # Age 1 from version 0: targets 0 and 1, both reserved at once; nothing more may start until a publish.
    setup = build(ListPrompts(100, 2), FakeGenerator(), idle_recheck_s=0.05)
    try:
        times = idle_after(setup, lambda: setup.buffer.is_covered(1) and not setup.collector.in_flight_ids())
    finally:
        setup.source.close()
    assert set(times) == set(COLLECTOR_TIME_REASONS)
    assert times[GENERATION_LIMIT_PAUSE] >= 0.5 * WAIT_S and others_are_zero(times, GENERATION_LIMIT_PAUSE)


def test_a_paused_collector_waits_for_the_refit():
    setup = build(ListPrompts(100, 2), FakeGenerator(), idle_recheck_s=0.05)
    try:
        setup.source.start()
        assert wait_until(lambda: setup.buffer.is_covered(1) and not setup.collector.in_flight_ids())
        setup.collector.prepare_for_weight_update()
        time.sleep(0.1)  # the wait in progress at the pause ends (idle_recheck_s) and is booked under its own reason
        times = idle_after(setup, lambda: True)
        setup.collector.resume_after_weight_update()
    finally:
        setup.source.close()
    assert times[REFIT_EVENT_WAIT] >= 0.5 * WAIT_S and others_are_zero(times, REFIT_EVENT_WAIT)


def test_a_collector_with_a_full_buffer_backs_off():
    # Age 2 from version 0: targets 0, 1 and 2 (6 groups) are collectable, but the buffer holds 4.
    ages = AgeSchedule(policy_training_start_step=0, train_age=2, warmup_age=2)
    setup = build(ListPrompts(100, 2), FakeGenerator(), ages=ages, max_size=4, idle_recheck_s=0.05)
    try:
        times = idle_after(setup, lambda: setup.buffer.free_slots() == 0 and not setup.collector.in_flight_ids())
    finally:
        setup.source.close()
    assert setup.buffer.needed(2) == 2
    assert times[BUFFER_FULL_BACKOFF] >= 0.5 * WAIT_S and others_are_zero(times, BUFFER_FULL_BACKOFF)


def test_the_seconds_of_a_failed_rollout_are_wasted_time():
    generator = FakeGenerator(fail_on=frozenset({0}), delay=lambda draw_id: 0.2 if draw_id == 0 else 0.0)
    budget = StepFailureBudget(4, "max_failed_groups_per_step")
    setup = build(ListPrompts(100, 2), generator, idle_recheck_s=0.05, failure_budget=budget)
    try:
        setup.source.start()
        assert wait_until(lambda: setup.collector.num_failed_rollouts == 1)
        times = setup.collector.time_tally.take()
    finally:
        setup.source.close()
    assert 0.2 <= times[FAILED_TRAJECTORY] < 1.0


def test_driver_breakdown_derives_idle_parts_and_efficiency_from_step_timings():
    step = {
        "async/idle/buffer_starvation": 1.0,
        "timing/sync_bubble": 0.5,
        "timing/validation": 1.5,
        "timing/step": 10.0,
    }
    # Idle 1 + 0.5 + 1.5 = 3 of 10 s: efficiency 0.7.
    assert driver_idle_breakdown(step) == pytest.approx(
        {"async/idle/refit_bubble": 0.5, "async/idle/validation": 1.5, "async/efficiency": 0.7}
    )
    without_validation = {key: value for key, value in step.items() if key != "timing/validation"}
    assert driver_idle_breakdown(without_validation)["async/idle/validation"] == 0.0
    assert driver_idle_breakdown(without_validation)["async/efficiency"] == pytest.approx(0.85)


def test_driver_breakdown_is_empty_for_sync_steps():
    assert driver_idle_breakdown({"timing/sync_bubble": 0.5, "timing/step": 10.0}) == {}
