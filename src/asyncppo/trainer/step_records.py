"""Records of a trained step, written on schedule into the run directory for offline analysis.

    plots/mismatch_step_N.png        the worst sequence's logprob curves, when the step's token_mult_prob_error
                                     passes logger.mismatch_plot_threshold, at most once per
                                     logger.mismatch_plot_period steps (schedule.MismatchPlotTrigger; also
                                     logged as an image)
    rollout_dumps/step_N.pt          per-token values, advantages and logprobs (ppo.log_rollout_dump)
    train_data_stepN.jsonl           every trained sample's texts, token counts, reward, mean advantage

Built by `trainer/build.py`; the driver loop calls `StepRecords.write` after each step.
"""

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from transformers import PreTrainedTokenizerBase

from asyncppo.algorithms.mismatch import mismatch_plot_data
from asyncppo.metrics import MetricsLogger
from asyncppo.metrics.train_data import train_data_path, train_data_records, write_train_data
from asyncppo.models.tokenizer import decode_ids
from asyncppo.trainer.ppo_step import StepOutput
from asyncppo.trainer.schedule import MismatchPlotTrigger, Schedule
from asyncppo.types import Trajectory

MISMATCH_KEY = "mismatch/token_mult_prob_error"


@dataclass(frozen=True)
class StepRecords:
    """Writes a step's records into `run_dir` when `schedule` says so."""

    run_dir: Path
    schedule: Schedule
    tokenizer: PreTrainedTokenizerBase
    """The driver's copy of the run's tokenizer, for the texts."""
    metrics: MetricsLogger
    """Where the mismatch plot is logged as an image."""
    num_generations_per_prompt: int
    turn_level_credit: bool
    """ppo.adv_estimator is turn_gae: dumps carry turn-level credit and its anchor tokens."""
    mismatch_plots: MismatchPlotTrigger = field(init=False)
    """The schedule's plot trigger; it remembers the steps it has seen (the one mutable part)."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "mismatch_plots", self.schedule.mismatch_plots())  # frozen: set once, here

    def decode(self, token_ids: Sequence[int]) -> str:
        """The text of `token_ids`, special tokens kept (records show exactly what was trained on)."""
        return decode_ids(self.tokenizer, token_ids)

    def write(
        self, completed: int, output: StepOutput, trajectories: Sequence[Trajectory], metrics: dict[str, float]
    ) -> None:
        """Whatever the schedule asks for after `completed` steps; `metrics` are the step's so far."""
        if self.mismatch_plots.should_plot(completed, metrics.get(MISMATCH_KEY)):
            self._plot_mismatch(output, completed)
        if self.schedule.dump_rollouts_after(completed):
            self._dump_rollouts(output, completed, metrics)
        if self.schedule.write_train_data_after(completed):
            self._write_train_data(trajectories, output, completed)

    def _plot_mismatch(self, output: StepOutput, step: int) -> None:
        batch = output.batch
        if batch.old_logprobs is None:
            return
        data = mismatch_plot_data(batch.old_logprobs, batch.generation_logprobs, batch.token_mask)
        if data is None:
            return
        # Imported here: matplotlib loads only in runs that plot.
        from asyncppo.metrics.plots import save_mismatch_plot

        path = save_mismatch_plot(data, self.run_dir / "plots" / f"mismatch_step_{step}.png", step)
        self.metrics.log_image(step, f"{MISMATCH_KEY}_plot", path)

    def _dump_rollouts(self, output: StepOutput, step: int, metrics: dict[str, float]) -> None:
        from asyncppo.metrics.rollout_dump import write_rollout_dump

        write_rollout_dump(
            self.run_dir / "rollout_dumps" / f"step_{step}.pt",
            step,
            output.batch,
            num_generations_per_prompt=self.num_generations_per_prompt,
            credit_level="turn" if self.turn_level_credit else "token",
            adv_raw_mean=metrics.get("adv_raw/mean", 0.0),
            adv_raw_std=metrics.get("adv_raw/std", 0.0),
            decode=self.decode,
            anchor_mask=output.batch.critic_mask if self.turn_level_credit else None,
        )

    def _write_train_data(self, trajectories: Sequence[Trajectory], output: StepOutput, step: int) -> None:
        records = train_data_records(
            step,
            output.batch,
            prompts=[self.decode(t.token_ids[: t.prompt_length]) for t in trajectories],
            responses=[self.decode(t.token_ids[t.prompt_length :]) for t in trajectories],
            reward_components=[t.reward_components for t in trajectories],
        )
        write_train_data(train_data_path(self.run_dir, step), records)
