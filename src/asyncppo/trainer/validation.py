"""Validation: the mean reward of the validation rows under the validation sampling profile.

Built by `trainer/build.py`; the driver loop calls `Validation.run(step)` when the schedule says so. The rows are
generated with a seed of their own per step (ppo.seed + 7919 step + VALIDATION_SEED_OFFSET), so a resumed run
validates on what an uninterrupted one would.
"""

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from asyncppo.rollout.reward_components import reward_component_metrics
from asyncppo.trainer.run_inputs import ValidationRolloutFn

log = logging.getLogger(__name__)
VALIDATION_SEED_OFFSET = 104729
"""Added to the step's sampling seed, so validation never draws what the step's training rollouts drew."""


@dataclass(frozen=True)
class Validation:
    """The validation rows and how to roll them out."""

    rows: list[dict[str, Any]]
    """The validation rows, already cut to ppo.max_val_samples."""
    rollout: ValidationRolloutFn
    num_generations_per_prompt: int
    """ppo.val_num_generations_per_prompt."""
    reseed: Callable[[int, int], None]
    """(step, seed offset) -> reseed the generators (GenerationSide.reseed)."""

    def run(self, step: int) -> dict[str, float]:
        """val/* metrics after `step` steps: reward, response length and turns (means), reward components, and the
        samples and failed prompt groups counted; {} without validation rows."""
        if not self.rows:
            return {}
        self.reseed(step, VALIDATION_SEED_OFFSET)
        trajectories, num_failed_groups = self.rollout(self.rows, self.num_generations_per_prompt)
        metrics = {"val/num_samples": float(len(trajectories)), "val/failed_groups": float(num_failed_groups)}
        if not trajectories:
            log.warning("validation at step %d: every prompt group failed; no reward to report", step)
            return metrics
        rewards = [t.reward for t in trajectories]
        lengths = [t.num_generated_tokens for t in trajectories]
        turns = [sum(span.role == "assistant" for span in t.message_log) for t in trajectories]
        return {
            **metrics,
            "val/reward_mean": sum(rewards) / len(rewards),
            "val/response_length_mean": sum(lengths) / len(lengths),
            "val/turns_per_sample": sum(turns) / len(turns),
            **reward_component_metrics(trajectories, namespace="val/"),
        }
