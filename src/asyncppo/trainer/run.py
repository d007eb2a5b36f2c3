"""A training run's components, built from the config: Ray worker groups, weight sync, data, sinks, checkpoints.

    Run: policy / value / generation groups, WeightSync (non-colocated), BatchSource, validation rows,
         MetricsLogger, CheckpointManager, PerfMeter (built by `trainer/build.py`)
The driver loop (`trainer/loop.py`) calls its methods in order; `close()` ends every process the run started.
"""

import dataclasses
import json
import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from transformers import PreTrainedTokenizerBase

from asyncppo.checkpoint import (
    CheckpointManager,
    RunState,
    load_run_state,
    load_state,
    restore_rng_state,
    save_rng_state,
    save_run_state,
    save_state,
)
from asyncppo.config import RunConfig, dump_config
from asyncppo.generation.engines import prefix_reuse_metrics
from asyncppo.metrics import MetricsLogger
from asyncppo.models.tokenizer import decode_ids
from asyncppo.pipeline.sources import BatchSource
from asyncppo.rollout.reward_components import reward_component_metrics
from asyncppo.trainer.perf import PerfMeter
from asyncppo.trainer.ppo_step import StepSettings
from asyncppo.trainer.privileged_critic import CriticPrefixes, PrivilegedCritic
from asyncppo.trainer.run_inputs import (
    ValidationRolloutFn,
)
from asyncppo.types import Trajectory
from asyncppo.workers.generator_group import GeneratorGroup
from asyncppo.workers.groups import PolicyGroup, ValueGroup, WeightSync
from asyncppo.workers.ray_host import WorkerGroup
from asyncppo.workers.reservations import Reservation, stop_workers

if TYPE_CHECKING:  # the gym's HTTP stack (fastapi, uvicorn, httpx) is imported only by runs that use the gym
    from asyncppo.trainer.gym_setup import GymRollouts

log = logging.getLogger(__name__)
WORKER_CALL_TIMEOUT_S = 3600.0
GYM_RESULTS_FILE = "gym_results.jsonl"
POLICY_DIR, VALUE_DIR, SOURCE_STATE_FILE, RNG_STATE_FILE, CONFIG_FILE, ACCOUNTING_FILE = (
    "policy",
    "value",
    "batch_source.pt",
    "rng.pt",
    "config.yaml",
    "accounting.json",
)


class PublishedVersion:
    """The weight version the generators hold (set on every publish); gym rollouts stamp it on trajectories."""

    def __init__(self) -> None:
        self.value = 0


@dataclass
class Run:
    """Everything the driver loop uses. Built by `build_run`; `close()` releases it."""

    config: RunConfig
    run_dir: Path
    step_settings: StepSettings
    policy: PolicyGroup
    value: ValueGroup | None
    generator: GeneratorGroup
    weight_sync: WeightSync | None
    source: BatchSource
    validation_rows: list[dict[str, Any]]
    validation_rollout: ValidationRolloutFn
    metrics: MetricsLogger
    checkpoints: CheckpointManager | None
    pad_token_id: int
    published: PublishedVersion
    tokenizer: PreTrainedTokenizerBase
    """The run's tokenizer (the driver's copy), for the texts of the run records."""
    perf: PerfMeter
    """The per-step throughput metrics (`perf/*`)."""
    groups: list[WorkerGroup[object]] = field(default_factory=list[WorkerGroup[object]])
    reservations: list[Reservation] = field(default_factory=list[Reservation])
    """The devices the groups sit on, given back after the groups end."""
    gym: "GymRollouts | None" = None
    privileged_critic: PrivilegedCritic | None = None
    engine_counters: dict[str, float] = field(default_factory=dict[str, float])
    """The generators' summed engine counters at the last `generation_metrics` call (the base of the next)."""
    engines_keep_counters: bool = True
    """False when every engine is `hf` (no prefix cache, no counters): the per-step read is skipped, since in
    async runs it queues behind the generators' busy request threads."""

    def critic_prefixes(self, trajectories: Sequence[Trajectory]) -> CriticPrefixes | None:
        """The privileged critic's prefixes for the step's trajectories (batch row order); None when it is off."""
        return self.privileged_critic.prefixes(trajectories) if self.privileged_critic is not None else None

    def decode(self, token_ids: Sequence[int]) -> str:
        """The text of `token_ids`, special tokens kept (run records show exactly what was trained on)."""
        return decode_ids(self.tokenizer, token_ids)

    def rollout_metrics(self) -> dict[str, float]:
        """Cumulative rollout-side counters logged with every step (gym requests, retries, failures, penalties)."""
        return self.gym.runner.metrics() if self.gym is not None else {}

    def generation_metrics(self) -> dict[str, float]:
        """The engines' prefix reuse since the previous call, summed over generator ranks ({} for hf engines).

        Deltas of cumulative counters, so whatever generated in between counts: the step's rollouts, its
        validation and, in async runs, rollouts the collector produced for later steps.
        """
        if not self.engines_keep_counters:
            return {}
        counters = self.generator.engine_counters()
        metrics = prefix_reuse_metrics(self.engine_counters, counters)
        self.engine_counters = counters
        return metrics

    def start_generation(self, step: int, seed_offset: int = 0) -> None:
        """Per-step sampling seed, through the batch source: a resumed sync run draws exactly what an
        uninterrupted one would (the async source leaves the engines alone)."""
        self.source.reseed_generation(self.config.ppo.seed + 7919 * step + seed_offset)

    def publish_policy(self, version: int, trained: bool) -> dict[str, float]:
        """Make generation use the policy of `version`: a push (non-colocated) or just the version (colocated)."""
        if self.weight_sync is not None and trained:
            report = self.weight_sync.push(version)
            self.published.value = version
            return {"timing/weight_sync": report.seconds, "weight_sync/bytes": float(report.num_bytes)}
        self.generator.set_policy_version(version)
        self.published.value = version
        return {}

    def validate(self, step: int) -> dict[str, float]:
        """Mean reward of one generation per validation prompt, with the validation sampling profile."""
        rows = self.validation_rows
        if self.config.ppo.max_val_samples is not None:
            rows = rows[: self.config.ppo.max_val_samples]
        if not rows:
            return {}
        self.start_generation(step, seed_offset=104729)
        trajectories, num_failed_groups = self.validation_rollout(rows, self.config.ppo.val_num_generations_per_prompt)
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

    def restore(self) -> int:
        """Resume from the newest complete checkpoint; returns the step to start from (0 for a fresh run)."""
        latest = self.checkpoints.latest() if self.checkpoints is not None else None
        if latest is None:
            self._warm_start_critic()
            return 0
        state = load_run_state(latest)
        if (latest / POLICY_DIR).is_dir():
            self.policy.load(latest / POLICY_DIR)
        else:
            log.warning(
                "checkpoint %s has no policy (still in critic warm-up): the policy starts from its base", latest
            )
        if self.value is not None:
            self.value.load(latest / VALUE_DIR)
        self.source.load_state_dict(load_state(latest / SOURCE_STATE_FILE))
        restore_rng_state(load_state(latest / RNG_STATE_FILE))
        print(f"resumed from {latest} (step {state.step})", flush=True)
        return state.step

    def _warm_start_critic(self) -> None:
        assert self.config.value is not None or self.value is None
        path = self.config.value.warm_start_path if self.config.value is not None else None
        if path is not None and self.value is not None:
            self.value.warm_start(path)
            print(f"critic warm-started from {path} (weights only, fresh optimizer)", flush=True)

    def log_accounting(self, step: int) -> None:
        """Print the books of every prompt drawn after `step` (ppo.async_ppo.log_every)."""
        print(f"accounting after step {step}: {self.source.accounting().summary()}", flush=True)

    def save(self, step: int, metrics: dict[str, float], policy_has_trained: bool) -> Path | None:
        """Write checkpoint `step_<step>` (the state after `step` completed steps)."""
        if self.checkpoints is None:
            return None
        directory = self.checkpoints.begin(step)
        if policy_has_trained:
            self.policy.save(directory / POLICY_DIR)
        if self.value is not None:
            self.value.save(directory / VALUE_DIR)
        # One snapshot: the books then describe exactly the state a resume starts from (the async collector runs on).
        snapshot = self.source.snapshot()
        source_state = snapshot.state
        save_state(directory / SOURCE_STATE_FILE, source_state)
        # The run's own books: every prompt drawn is trained, dropped with a reason, buffered or pending.
        (directory / ACCOUNTING_FILE).write_text(json.dumps(dataclasses.asdict(snapshot.accounting), indent=1))
        save_state(directory / RNG_STATE_FILE, save_rng_state())
        # Where the critic's first weights came from stays on record in every checkpoint of the run.
        warm_start = self.config.value.warm_start_path if self.config.value is not None else None
        extra = {"value_warm_start": warm_start} if warm_start else {}
        prompts = source_state.get("prompts", {})
        run_state = RunState(
            step=step,
            epoch=int(prompts.get("epoch", 0)),
            num_consumed_prompts=int(prompts.get("num_prompts_consumed", step * self.config.ppo.num_prompts_per_step)),
            extra=extra,
        )
        save_run_state(directory, run_state)
        (directory / CONFIG_FILE).write_text(dump_config(self.config))
        ranking = {key.replace("/", ":", 1): value for key, value in metrics.items() if math.isfinite(value)}
        return self.checkpoints.finalize(step, {**metrics, **ranking})

    def close(self) -> None:
        """Close the sinks and end every worker process this run started."""
        try:
            self.source.close()
            self.metrics.close()
            if self.gym is not None:
                self.gym.close()
        finally:
            stop_workers(self.groups, self.reservations)
