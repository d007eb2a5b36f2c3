"""TrajectoryBuffer: reservations, eviction, FIFO take, backpressure, restore on resume, ledger."""

import io

import pytest
import torch
from pipeline_fakes import make_trajectory

from asyncppo.pipeline.buffer import (
    EXPIRED_ON_RESTORE,
    INCOMPLETE_ON_RESTORE,
    MISSED_TARGET,
    OUTSIDE_WINDOW_ON_RESTORE,
    OVERFLOW_ON_RESTORE,
    STALE,
    SURPLUS,
    TrajectoryBuffer,
)
from asyncppo.pipeline.ledger import (
    AccountingError,
    AccountingLedger,
    AccountingReport,
    IdRanges,
    find_accounting_problems,
)
from asyncppo.pipeline.plain_state import check_plain_data, trajectory_from_state, trajectory_to_state


def fill(buffer: TrajectoryBuffer, draws: list[tuple[int, int, int]]) -> None:
    """Reserve and complete (draw id, generation version, target) in order."""
    for draw_id, version, target in draws:
        assert buffer.reserve(target, version, [draw_id])
        buffer.add_group(draw_id, [make_trajectory(draw_id, 0, version), make_trajectory(draw_id, 1, version)])


def roundtrip(state: dict) -> dict:
    file = io.BytesIO()
    torch.save(state, file)
    file.seek(0)
    return torch.load(file, weights_only=True)


def seed_restore_state() -> dict:
    # Generation versions [0, 1, 1, 2], targets [1, 2, 2, 3], N = 2: resuming at step 2, target 2 is complete
    # and target 3 is not.
    buffer = TrajectoryBuffer(num_groups_per_step=2, max_size=8)
    fill(buffer, [(0, 0, 1), (1, 1, 2), (2, 1, 2), (3, 2, 3)])
    return roundtrip(buffer.state_dict())


def restored(state: dict, step: int, drop: bool, max_size: int = 8, max_age: int = 1) -> TrajectoryBuffer:
    buffer = TrajectoryBuffer(num_groups_per_step=2, max_size=max_size)
    buffer.load_state_dict(state, step, drop_incomplete_targets=drop, max_age_of_step=lambda _step: max_age)
    return buffer


def targets_of(buffer: TrajectoryBuffer) -> list[int]:
    state = buffer.state_dict()
    return [group["target_step"] for group in state["groups"]]


def test_local_restore_keeps_incomplete_targets_for_gap_fill():
    buffer = restored(seed_restore_state(), step=2, drop=False)
    # Target 1 < resume step 2 goes; complete target 2 stays; incomplete target 3 stays and needs 1 more group.
    assert targets_of(buffer) == [2, 2, 3]
    assert buffer.watermark == 1
    assert buffer.needed(3) == 1
    assert buffer.dropped_counts() == {EXPIRED_ON_RESTORE: 1}


def test_local_restore_drops_incomplete_targets_for_fresh_regen():
    buffer = restored(seed_restore_state(), step=2, drop=True)
    assert targets_of(buffer) == [2, 2]
    assert buffer.needed(3) == 2
    assert buffer.dropped_counts() == {EXPIRED_ON_RESTORE: 1, INCOMPLETE_ON_RESTORE: 1}
    assert buffer.ledger.outcome(3) == f"dropped/{INCOMPLETE_ON_RESTORE}"


def test_restore_drops_groups_outside_the_window_and_beyond_max_size():
    buffer = TrajectoryBuffer(num_groups_per_step=2, max_size=8)
    fill(buffer, [(0, 0, 3), (1, 3, 4), (2, 3, 4), (3, 4, 5), (4, 4, 5)])
    # Resume at 3 with max age 1: version 0 cannot reach target 3 (0 < 3 - 1). max_size 3 keeps the lowest
    # targets: draw 1, 2 (target 4) and one of target 5; the other target-5 group overflows.
    buffer = restored(roundtrip(buffer.state_dict()), step=3, drop=False, max_size=3)
    assert buffer.dropped_counts() == {OUTSIDE_WINDOW_ON_RESTORE: 1, OVERFLOW_ON_RESTORE: 1}
    assert targets_of(buffer) == [4, 4, 5]


def test_take_evicts_stale_groups_and_returns_the_target_fifo():
    buffer = TrajectoryBuffer(num_groups_per_step=2, max_size=8)
    fill(buffer, [(0, 0, 2), (1, 1, 2), (2, 1, 3)])
    assert buffer.take(2, max_age=1) is None  # draw 0 (version 0 < 2 - 1) is evicted; one group left for 2
    assert buffer.ledger.outcome(0) == f"dropped/{STALE}"
    assert buffer.needed(2) == 1
    fill(buffer, [(3, 1, 2)])
    taken = buffer.take(2, max_age=1)
    assert taken is not None and [group.draw_id for group in taken] == [1, 3]
    assert buffer.watermark == 2 and buffer.needed(2) == 0
    assert buffer.take(3, max_age=2) is None  # target 3 still short; draw 2 (version 1 >= 3 - 2) stays
    assert buffer.buffered_ids() == [2]


def test_take_drops_surplus_groups_of_the_target_with_a_reason():
    # Only a restore can over-fill a target (a smaller N than the run that saved it).
    big = TrajectoryBuffer(num_groups_per_step=3, max_size=8)
    fill(big, [(0, 0, 1), (1, 0, 1), (2, 0, 1)])
    buffer = restored(roundtrip(big.state_dict()), step=1, drop=True, max_age=2)
    taken = buffer.take(1, max_age=2)
    assert taken is not None and [group.draw_id for group in taken] == [0, 1]
    assert buffer.ledger.outcome(2) == f"dropped/{SURPLUS}"


def test_reserve_applies_backpressure_instead_of_blocking_add():
    buffer = TrajectoryBuffer(num_groups_per_step=2, max_size=3)
    assert buffer.reserve(1, 0, [0, 1])
    assert not buffer.reserve(1, 0, [2])  # target 1 is covered
    assert not buffer.reserve(2, 0, [2, 3])  # only one free slot
    assert buffer.reserve(2, 0, [2])
    assert buffer.free_slots() == 0
    fill_ids = [0, 1, 2]
    for draw_id in fill_ids:  # adds of reserved groups never wait, even with the buffer full
        buffer.add_group(draw_id, [make_trajectory(draw_id)])
    assert buffer.size() == 3 and buffer.is_covered(1) and not buffer.is_covered(2)


def test_a_group_arriving_after_its_target_was_taken_is_accounted_as_missed():
    buffer = TrajectoryBuffer(num_groups_per_step=1, max_size=4)
    assert buffer.reserve(0, 0, [0])
    fill(buffer, [(1, 0, 1)])
    buffer._watermark = 0  # as if target 0 had been taken by another path (white-box: not reachable normally)
    buffer.add_group(0, [make_trajectory(0)])
    assert buffer.ledger.outcome(0) == f"dropped/{MISSED_TARGET}"


def test_add_group_rejects_a_group_with_the_wrong_group_id():
    buffer = TrajectoryBuffer(num_groups_per_step=1, max_size=4)
    assert buffer.reserve(0, 0, [0])
    with pytest.raises(ValueError, match="group_id 0"):
        buffer.add_group(0, [make_trajectory(5)])


def test_trajectories_round_trip_exactly_through_a_weights_only_checkpoint():
    trajectory = make_trajectory(4, 1, version=3, last_version=5, task={"prompt": "2+2", "answer": [4, "four"]})
    back = trajectory_from_state(roundtrip(trajectory_to_state(trajectory)))
    assert back == trajectory
    assert back.generation_logprobs[2] == -0.1234567890123  # float64 storage: bit-exact, not float32-rounded


def test_plain_data_check_names_the_offending_path():
    check_plain_data({"a": [1, 2.0, "x", None, {"b": True}]}, "row")
    with pytest.raises(ValueError, match=r"row\['a'\]\[1\] holds a set"):
        check_plain_data({"a": [1, {2}]}, "row")


def test_id_ranges_merge_neighbours_and_round_trip():
    ids = IdRanges()
    for draw_id in [5, 3, 4, 0, 9, 1]:
        ids.add(draw_id)
    assert ids.ranges() == [(0, 2), (3, 6), (9, 10)]
    assert len(ids) == 6 and 4 in ids and 2 not in ids
    assert IdRanges.from_state(ids.state()).ranges() == ids.ranges()
    with pytest.raises(AccountingError):
        ids.add(4)


def test_ledger_refuses_to_account_a_draw_twice():
    ledger = AccountingLedger()
    ledger.record_trained([0, 1])
    ledger.record_dropped([2], STALE)
    with pytest.raises(AccountingError, match="already trained"):
        ledger.record_dropped([1], STALE)
    with pytest.raises(AccountingError, match="already dropped/stale"):
        ledger.record_trained([2])
    restored_ledger = AccountingLedger()
    restored_ledger.load_state_dict(roundtrip(ledger.state_dict()))
    assert find_accounting_problems(restored_ledger, buffered=[3], pending=[4], next_draw_id=5) == []
    problems = find_accounting_problems(restored_ledger, buffered=[3, 1], pending=[], next_draw_id=6)
    assert problems == ["draw id 1 is in ['trained', 'buffered']", "2 draw ids are unaccounted for: [4, 5]"]


def test_accounting_summary_is_one_line_of_counts():
    # What the driver prints every ppo.async_ppo.log_every steps.
    report = AccountingReport(
        trained=[(0, 6), (8, 10)],
        dropped={STALE: [(6, 7)], MISSED_TARGET: [(7, 8)]},
        buffered=[10, 11],
        pending=[12],
        next_draw_id=13,
        problems=[],
    )
    assert report.summary() == (
        "13 prompts drawn: 8 trained, 2 dropped (missed_target 1, stale 1), 2 buffered, 1 pending"
    )
    report.problems = ["2 draw ids are unaccounted for: [13, 14]"]
    assert report.summary().endswith("1 pending; the books do not balance: 2 draw ids are unaccounted for: [13, 14]")
