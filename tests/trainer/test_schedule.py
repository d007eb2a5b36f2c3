"""The run's schedule answers from the config what the driver loop used to read itself: when to validate,
checkpoint, print the books and write records."""

from pathlib import Path

from asyncppo.config import load_config
from asyncppo.trainer.schedule import Schedule

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
    plots = _schedule("logger.mismatch_plot_threshold=1.5")
    assert plots.plot_mismatch(1.6) and not plots.plot_mismatch(1.5) and not plots.plot_mismatch(None)


def test_train_data_is_not_written_when_the_gym_logs_its_own_responses():
    schedule = Schedule.from_config(load_config(DEMO, ["logger.train_data_period=1"]))
    gym_logged = Schedule(schedule.ppo, schedule.checkpointing, schedule.logger, logs_gym_responses=True)
    assert schedule.write_train_data_after(1) and not gym_logged.write_train_data_after(1)
