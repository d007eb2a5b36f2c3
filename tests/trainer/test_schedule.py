"""The run's schedule answers from the config what the driver loop used to read itself: when to validate,
checkpoint, print the books and write records."""

import itertools
import random
from collections.abc import Sequence
from pathlib import Path

import pytest

from asyncppo.config import load_config
from asyncppo.trainer.schedule import MismatchPlotTrigger, Schedule

DEMO = Path(__file__).parents[2] / "examples" / "configs" / "demo_sync.yaml"


def _schedule(*overrides: str) -> Schedule:
    return Schedule.from_config(load_config(DEMO, ["ppo.max_num_steps=10", *overrides]))


def test_validation_every_period_and_after_the_last_step():
    schedule = _schedule("ppo.val_period=4", "ppo.val_at_end=true", "ppo.val_at_start=true")
    assert [step for step in range(1, 11) if schedule.validate_after(step)] == [4, 8, 10]
    assert schedule.validate_at_start(0) and not schedule.validate_at_start(3)  # a resumed run does not
    never = _schedule("ppo.val_period=0", "ppo.val_at_end=false", "ppo.val_at_start=false")
    assert not any(never.validate_after(step) for step in range(1, 11)) and not never.validate_at_start(0)


def test_checkpoints_every_period_after_the_last_step_and_whenever_the_run_stops():
    schedule = _schedule("checkpointing.enabled=true", "checkpointing.save_period=3")
    assert [step for step in range(1, 11) if schedule.checkpoint_after(step, stopping=False)] == [3, 6, 9, 10]
    assert schedule.checkpoint_after(5, stopping=True)
    off = _schedule("checkpointing.enabled=false", "checkpointing.save_period=3")
    assert not off.checkpoints and not off.checkpoint_after(10, stopping=True)


def test_the_deadline_counts_from_the_loop_start():
    # 00:00:01:30 = 90 s.
    schedule = _schedule("checkpointing.enabled=true", "checkpointing.checkpoint_must_save_by=00:00:01:30")
    assert not schedule.out_of_time(89.9) and schedule.out_of_time(90.0)
    assert not _schedule().out_of_time(1e9)


def test_books_every_n_steps_never_for_0_and_every_step_for_null():
    assert [s for s in range(1, 11) if _schedule("ppo.async_ppo.log_every=5").accounting_after(s)] == [5, 10]
    assert not any(_schedule("ppo.async_ppo.log_every=0").accounting_after(s) for s in range(1, 11))
    assert all(_schedule("ppo.async_ppo.log_every=null").accounting_after(s) for s in range(1, 11))


def test_records_follow_their_switches_and_periods():
    dumps = _schedule("ppo.log_rollout_dump=true", "ppo.rollout_dump_period=2")
    assert [step for step in range(1, 7) if dumps.dump_rollouts_after(step)] == [2, 4, 6]
    assert not _schedule("ppo.log_rollout_dump=false").dump_rollouts_after(2)
    assert [s for s in range(1, 7) if _schedule("logger.train_data_period=3").write_train_data_after(s)] == [3, 6]
    assert not _schedule("logger.train_data_period=0").write_train_data_after(3)


def test_train_data_is_not_written_when_the_gym_logs_its_own_responses():
    schedule = Schedule.from_config(load_config(DEMO, ["logger.train_data_period=1"]))
    gym_logged = Schedule(schedule.ppo, schedule.checkpointing, schedule.logger, logs_gym_responses=True)
    assert schedule.write_train_data_after(1) and not gym_logged.write_train_data_after(1)


def _plotted(trigger: MismatchPlotTrigger, errors: Sequence[float | None]) -> list[int]:
    """The steps (1-based, one per error) the trigger plots."""
    return [step for step, error in enumerate(errors, start=1) if trigger.should_plot(step, error)]


def test_a_mismatch_plot_needs_an_error_above_the_threshold():
    trigger = _schedule("logger.mismatch_plot_threshold=1.5", "logger.mismatch_plot_period=1").mismatch_plots()
    # Period 1 and errors rising: each step above 1.5 is a new high since the previous plot.
    assert _plotted(trigger, [1.5, None, 1.6, 1.7]) == [3, 4]


def test_mismatch_plots_come_at_most_once_per_period_and_only_on_a_new_high_of_the_period():
    trigger = _schedule("logger.mismatch_plot_threshold=1.05", "logger.mismatch_plot_period=3").mismatch_plots()
    errors = [1.2, 1.3, 1.25, 1.1, 1.4, 1.2, 1.3, 1.35, 1.0, 1.36, 1.1, 1.2, 1.15]
    # Step 1: the first above 1.05. Steps 2-3 wait out the period; step 4 (1.1) may plot but is below steps 2-3
    # (1.3, 1.25); step 5 (1.4) is above steps 3-4. Steps 6-7 wait; step 8 (1.35) is above steps 6-7 (1.2, 1.3).
    # Steps 9-10 wait; step 11 (1.1) is below step 10 (1.36), step 12 (1.2) too; step 13 (1.15) is below step 12.
    assert _plotted(trigger, errors) == [1, 5, 8]


def test_a_spike_too_soon_after_a_plot_holds_the_next_back_for_one_period_only():
    trigger = MismatchPlotTrigger(threshold=1.05, period=4)
    errors = [1.1, 1.9, 1.1, 1.1, 1.1, 1.12, 1.11, 1.1, 1.1, 1.13]
    # Step 1 plots; the spike at step 2 may not (1 step later). Step 5 (1.1, may plot again) is below the spike,
    # which is among steps 2-4; step 6 (1.12) is above steps 3-5 (1.1 each), so it plots. Step 10 (1.13) is above
    # steps 7-9 and 4 steps after step 6.
    assert _plotted(trigger, errors) == [1, 6, 10]


def test_a_mismatch_above_the_threshold_every_step_is_plotted_about_once_per_two_periods():
    trigger = MismatchPlotTrigger(threshold=1.05, period=10)
    # 200 steps whose mismatch wanders in 1.05-1.35, as the async demo's does: every step passes the threshold (the
    # demo wrote a plot for most steps before). After each plot, a step plots once it is the highest of the last
    # 10, about once in 10 steps after the wait: 11 plots with this seed, never two within 10 steps.
    rng = random.Random(0)
    plotted = _plotted(trigger, [rng.uniform(1.05, 1.35) for _ in range(200)])
    assert plotted[0] == 1 and all(later - earlier >= 10 for earlier, later in itertools.pairwise(plotted))
    assert len(plotted) == 11


def test_steps_without_the_metric_or_with_nan_never_plot_nor_block_the_next():
    trigger = MismatchPlotTrigger(threshold=1.05, period=2)
    assert _plotted(trigger, [None, float("nan"), 1.06]) == [3]


def test_the_plot_period_must_be_positive():
    with pytest.raises(ValueError, match="period must be >= 1"):
        MismatchPlotTrigger(threshold=1.05, period=0)


def test_the_step_records_write_a_mismatch_plot_only_when_the_trigger_says_so(tmp_path: Path, tiny_dir: Path):
    from ppo_fakes import collate, single_turn

    from asyncppo.metrics import MetricsLogger
    from asyncppo.models.tokenizer import load_tokenizer
    from asyncppo.trainer.ppo_step import StepOutput
    from asyncppo.trainer.step_records import MISMATCH_KEY, StepRecords

    schedule = _schedule("logger.mismatch_plot_period=3", "logger.train_data_period=0")
    records = StepRecords(tmp_path, schedule, load_tokenizer(tiny_dir), MetricsLogger([]), 2, turn_level_credit=False)
    trajectories = [single_turn(prompt=3, response=4, reward=1.0, group_id=0, sample_index=i) for i in range(2)]
    batch = collate(trajectories)
    # The trainer's logprobs differ from the generator's (-0.5 per generated token): a plot has data to draw.
    batch = batch.with_fields(old_logprobs=batch.generation_logprobs - 0.1 * batch.token_mask)
    errors = [1.2, 1.3, 1.25, 1.1, 1.4, 1.2]
    for step, error in enumerate(errors, start=1):
        output = StepOutput(batch=batch, metrics={MISMATCH_KEY: error}, policy_trained=True)
        records.write(step, output, trajectories, {MISMATCH_KEY: error})
    # As in the trigger's own test: step 1, then step 5 (the highest of steps 3-5, 4 steps after step 1).
    assert sorted(path.name for path in (tmp_path / "plots").iterdir()) == [
        "mismatch_step_1.png",
        "mismatch_step_5.png",
    ]
