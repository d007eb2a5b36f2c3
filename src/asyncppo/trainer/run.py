"""A training run's parts, by role, as the driver loop (trainer/loop.py) uses them; built by `trainer/build.py`.

Run.schedule      when to validate, checkpoint, log the books, write records       trainer/schedule.py
Run.policy/value  the trained worker groups; ppo_step calls them                   workers/groups.py
Run.source        the step's batch; wraps each weight update                       pipeline/sources.py
Run.generation    publish weights, reseed, engine counters                         trainer/generation_side.py
Run.validation    val/* metrics                                                    trainer/validation.py
Run.checkpoints   restore once, save on schedule                                   trainer/run_checkpoints.py
Run.records       mismatch plots, rollout dumps, train data                        trainer/step_records.py
Run.metrics, Run.perf, Run.critic_view                                             sinks, perf/*, privileged view
Run.owned         what `close()` ends: the batch source, sinks, gym servers, worker processes, reservations
"""

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from asyncppo.metrics import MetricsLogger
from asyncppo.pipeline.sources import BatchSource
from asyncppo.trainer.generation_side import GenerationSide
from asyncppo.trainer.perf import PerfMeter
from asyncppo.trainer.ppo_step import StepSettings
from asyncppo.trainer.privileged_critic import CriticPrefixes, PrivilegedCritic
from asyncppo.trainer.run_checkpoints import RunCheckpoints
from asyncppo.trainer.schedule import Schedule
from asyncppo.trainer.step_records import StepRecords
from asyncppo.trainer.validation import Validation
from asyncppo.trainer.worker_start import StartedWorkers
from asyncppo.types import Trajectory

if TYPE_CHECKING:  # the gym's HTTP stack (fastapi, uvicorn, httpx) is imported only by runs that use the gym
    from asyncppo.trainer.gym_setup import GymRollouts


@dataclass
class OwnedResources:
    """What a run started and must end, in the order `close` ends it."""

    source: BatchSource
    metrics: MetricsLogger
    gym: "GymRollouts | None"
    workers: StartedWorkers

    def close(self, keep_workers: bool = False) -> None:
        """Close the batch source, the sinks and the gym servers, then end every worker process (always); with
        `keep_workers` (a run that ended well), keep them for this process's next run when the environment asks
        for it (ASYNCPPO_KEEP_WORKER_PROCESSES=1, see workers/host_pool.py)."""
        closed = False
        try:
            self.source.close()
            self.metrics.close()
            if self.gym is not None:
                self.gym.close()
            closed = True
        finally:
            self.workers.stop(keep=keep_workers and closed)


@dataclass
class Run:
    """Everything the driver loop uses. Built by `build_run`; `close()` releases it."""

    schedule: Schedule
    step_settings: StepSettings
    source: BatchSource
    generation: GenerationSide
    validation: Validation
    checkpoints: RunCheckpoints
    metrics: MetricsLogger
    records: StepRecords
    perf: PerfMeter
    """The per-step throughput metrics (`perf/*`)."""
    pad_token_id: int
    critic_view: PrivilegedCritic | None
    """The privileged critic's view of the trajectories; None when it is off."""
    owned: OwnedResources

    @property
    def workers(self) -> StartedWorkers:
        """The worker groups (policy, value, generator, weight sync)."""
        return self.owned.workers

    def critic_prefixes(self, trajectories: Sequence[Trajectory]) -> CriticPrefixes | None:
        """The privileged critic's prefixes for the step's trajectories (batch row order); None when it is off."""
        return self.critic_view.prefixes(trajectories) if self.critic_view is not None else None

    def rollout_metrics(self) -> dict[str, float]:
        """Cumulative rollout-side counters logged with every step (gym requests, retries, failures, penalties)."""
        gym = self.owned.gym
        return gym.runner.metrics() if gym is not None else {}

    def log_accounting(self, step: int) -> None:
        """Print the books of every prompt drawn after `step` (ppo.async_ppo.log_every)."""
        print(f"accounting after step {step}: {self.source.accounting().summary()}", flush=True)

    def close(self, keep_workers: bool = False) -> None:
        """End what the run started (`OwnedResources.close`)."""
        self.owned.close(keep_workers)
