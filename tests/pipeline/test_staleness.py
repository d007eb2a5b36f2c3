"""Staleness arithmetic, by hand: target windows, warm-up age boundaries at W and W + train age, freeze-aware
policy ages, and which targets a group survives to."""

import pytest
from pipeline_fakes import make_trajectory

from asyncppo.pipeline.buffer import STALE, TrajectoryBuffer
from asyncppo.pipeline.staleness import (
    AgeSchedule,
    collector_lead_age,
    policy_age,
    sample_max_age,
    survives_until,
    target_window,
)


def test_target_window_includes_its_own_step_only_for_the_initial_version():
    assert list(target_window(generation_version=3, initial_version=3, age=2)) == [3, 4, 5]
    assert list(target_window(generation_version=4, initial_version=3, age=2)) == [5, 6]
    assert list(target_window(generation_version=0, initial_version=0, age=1)) == [0, 1]


def test_async_warmup_age_boundaries_no_elevation():
    # warmup_age == train_age: both ages are the train age at every step, before and after W.
    for step in range(12):
        assert collector_lead_age(step, 5, train_age=2, warmup_age=2) == 2
        assert sample_max_age(step, 5, train_age=2, warmup_age=2) == 2


def test_async_warmup_collector_lead_age_boundary_at_W():
    # W = 3: versions 0..3 are the frozen pi_0, so the collector banks warmup_age ahead through version 3.
    assert [collector_lead_age(step, 3, train_age=1, warmup_age=4) for step in range(6)] == [4, 4, 4, 4, 1, 1]


def test_async_warmup_sample_max_age_boundary_at_W_plus_train_age():
    # W = 3, train_age = 2: eviction keeps the warmup age through step W + train_age = 5, not only through W.
    assert [sample_max_age(step, 3, train_age=2, warmup_age=5) for step in range(8)] == [5, 5, 5, 5, 5, 5, 2, 2]


def test_async_trajectory_policy_age_is_freeze_aware():
    # W = 3: (s, g) = (0,0)..(4,0): max(0, s-3) - 0 = 0,0,0,0,1; (5,4): 2 - 1 = 1.
    consumed = [(0, 0), (1, 0), (2, 0), (3, 0), (4, 0), (5, 4)]
    assert [policy_age(s, g, 3) for s, g in consumed] == [0, 0, 0, 0, 1, 1]
    assert policy_age(10, 7, 0) == 3  # no warm-up: plain version difference


def test_replay_buffer_admits_banked_frozen_rollout_at_boundary():
    # W = 3, train_age = 1, warmup_age = 4. A group generated with version 0 (pi_0) for target 4 = W + train_age
    # trains pi_1 with data one policy update old: valid. sample_max_age(4) = 4 keeps it; snapping the
    # eviction age to train_age at W would evict it (0 < 4 - 1) although the collector is past target 4.
    ages = AgeSchedule(policy_training_start_step=3, train_age=1, warmup_age=4)
    assert ages.sample_max_age(4) == 4 and ages.policy_age(4, 0) == 1

    def banked_buffer() -> TrajectoryBuffer:
        buffer = TrajectoryBuffer(num_groups_per_step=1, max_size=8)
        assert buffer.reserve(target=4, generation_version=0, draw_ids=[7])
        buffer.add_group(7, [make_trajectory(7)])
        return buffer

    taken = banked_buffer().take(4, max_age=ages.sample_max_age(4))
    assert taken is not None and [group.draw_id for group in taken] == [7]
    snapped = banked_buffer()
    assert snapped.take(4, max_age=ages.train_age) is None
    assert snapped.dropped_counts() == {STALE: 1}


def test_collectable_targets_stop_where_the_group_would_be_evicted():
    # W = 3, train 1, warmup 4: sample_max_age(s) = 4 for s <= 4, else 1. Version 0 (initial) banks 0..4;
    # versions 1..3 would lead to 5..7 but no version below 4 survives take(5) (g >= 5 - 1), so they stop at 4.
    ages = AgeSchedule(policy_training_start_step=3, train_age=1, warmup_age=4)
    assert ages.collectable_targets(0, initial_version=0) == [0, 1, 2, 3, 4]
    assert ages.collectable_targets(1, initial_version=0) == [2, 3, 4]
    assert ages.collectable_targets(3, initial_version=0) == [4]
    assert ages.collectable_targets(4, initial_version=0) == [5]
    plain = AgeSchedule(policy_training_start_step=0, train_age=2, warmup_age=2)
    assert plain.collectable_targets(5, initial_version=0) == [6, 7]
    assert plain.collectable_targets(5, initial_version=5) == [5, 6, 7]


def test_survival_checks_every_step_when_warmup_age_is_below_train_age():
    # W = 2, train 3, warmup 1: max age 1 through step 5, then 3. A version-3 group for target 6 passes the
    # target's own check (3 >= 6 - 3) but take(5) evicts it (3 < 5 - 1).
    ages = AgeSchedule(policy_training_start_step=2, train_age=3, warmup_age=1)
    assert not survives_until(3, 6, ages.sample_max_age)
    assert survives_until(4, 6, ages.sample_max_age)
    assert survives_until(3, 6, ages.sample_max_age, first_step=6)  # steps before 6 already passed


@pytest.mark.parametrize("key", ["train_age", "warmup_age"])
def test_age_schedule_rejects_zero_ages(key: str):
    settings = {"policy_training_start_step": 0, "train_age": 1, "warmup_age": 1, key: 0}
    with pytest.raises(ValueError, match="must be >= 1"):
        AgeSchedule(**settings)
