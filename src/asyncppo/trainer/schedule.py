"""When a run does what: the one object the driver loop asks "validate / checkpoint / log / dump now?".

Built from the config by `Schedule.from_config` (trainer/build.py); `trainer/loop.py` reads no config key itself.
Every question takes `completed`, the number of steps done so far (the step just finished is `completed`):

    validate_at_start(start)      ppo.val_at_start, on a fresh run only
    validate_after(completed)     every ppo.val_period steps, and after the last with ppo.val_at_end
    checkpoint_after(...)         every checkpointing.save_period steps, after the last, and whenever the run
                                  stops (a signal, or checkpointing.checkpoint_must_save_by reached)
    accounting_after(completed)   ppo.async_ppo.log_every: every N steps, 0 never, null every step
    dump_rollouts_after(...)      ppo.log_rollout_dump with ppo.rollout_dump_period
    write_train_data_after(...)   logger.train_data_period (not when the gym's own responses are logged)
    mismatch_plots()              logger.mismatch_plot_threshold with logger.mismatch_plot_period: the one
                                  stateful answer, a MismatchPlotTrigger the step records keep
"""

import math
from collections import deque
from dataclasses import dataclass

from asyncppo.config import RunConfig
from asyncppo.config.logger import LoggerConfig
from asyncppo.config.ppo import PPOConfig
from asyncppo.config.runtime import CheckpointingConfig


def _every(period: int | None, completed: int) -> bool:
    """True every `period` steps; never for a period of 0 or None."""
    return bool(period) and completed % period == 0


@dataclass(frozen=True)
class Schedule:
    """The config sections that say when things happen, and the answers."""

    ppo: PPOConfig
    checkpointing: CheckpointingConfig
    logger: LoggerConfig
    logs_gym_responses: bool
    """env.should_log_nemo_gym_responses: the gym's own log then holds every trained sample's texts, so the train
    data records are not written."""

    @classmethod
    def from_config(cls, config: RunConfig) -> "Schedule":
        return cls(config.ppo, config.checkpointing, config.logger, config.env.should_log_nemo_gym_responses)

    @property
    def max_num_steps(self) -> int:
        return self.ppo.max_num_steps

    @property
    def checkpoints(self) -> bool:
        """checkpointing.enabled."""
        return self.checkpointing.enabled

    def policy_has_trained(self, start: int) -> bool:
        """Whether a run resumed at `start` holds a trained policy (past the critic's warm-up steps)."""
        return start > self.ppo.policy_training_start_step

    def validate_at_start(self, start: int) -> bool:
        return self.ppo.val_at_start and start == 0

    def validate_after(self, completed: int) -> bool:
        return _every(self.ppo.val_period, completed) or (self.ppo.val_at_end and completed == self.max_num_steps)

    def checkpoint_after(self, completed: int, stopping: bool) -> bool:
        """`stopping`: the run ends after this step for a reason of its own (a signal, the deadline)."""
        if not self.checkpointing.enabled:
            return False
        return _every(self.checkpointing.save_period, completed) or completed == self.max_num_steps or stopping

    def out_of_time(self, elapsed_s: float) -> bool:
        """Whether checkpointing.checkpoint_must_save_by has passed, `elapsed_s` seconds after the loop began."""
        deadline = self.checkpointing.must_save_by_seconds
        return deadline is not None and elapsed_s >= deadline

    def accounting_after(self, completed: int) -> bool:
        period = self.ppo.async_ppo.log_every
        return period is None or _every(period, completed)

    def dump_rollouts_after(self, completed: int) -> bool:
        return self.ppo.log_rollout_dump and _every(self.ppo.rollout_dump_period, completed)

    def write_train_data_after(self, completed: int) -> bool:
        return not self.logs_gym_responses and _every(self.logger.train_data_period, completed)

    def mismatch_plots(self) -> "MismatchPlotTrigger":
        """A fresh trigger for the run's mismatch plots (it remembers the steps it has seen)."""
        return MismatchPlotTrigger(self.logger.mismatch_plot_threshold, self.logger.mismatch_plot_period)


class MismatchPlotTrigger:
    """Whether a step gets a mismatch plot: at most one per `period` steps, each on a new high of the error.

    Step s with error e (mismatch/token_mult_prob_error) is plotted when
        e > threshold,  no plot yet or s - last_plot >= period,  e > the errors of steps s - period + 1 .. s - 1.
    Those earlier steps all come after the last plot (the second rule), so a plot shows the worst of the last
    `period` steps, none of them plotted before; a spike too soon after a plot holds the next one back for
    `period` steps, not for the rest of the run. A resumed run starts with a fresh trigger (its first step above
    the threshold is plotted).
    """

    def __init__(self, threshold: float, period: int) -> None:
        if period < 1:
            raise ValueError(f"mismatch plot period must be >= 1, got {period}")
        self.threshold = threshold
        self.period = period
        self.last_plot_step: int | None = None
        self.recent_errors: deque[float] = deque(maxlen=period - 1)
        """The errors of the previous period - 1 steps (a step without the metric, or a NaN, counts as -inf)."""

    def should_plot(self, step: int, token_mult_prob_error: float | None) -> bool:
        """Decide for `step` (called once per step, in order) and remember its error."""
        error = (
            -math.inf if token_mult_prob_error is None or math.isnan(token_mult_prob_error) else token_mult_prob_error
        )
        rested = self.last_plot_step is None or step - self.last_plot_step >= self.period
        plot = error > self.threshold and rested and all(error > earlier for earlier in self.recent_errors)
        if plot:
            self.last_plot_step = step
        self.recent_errors.append(error)
        return plot
