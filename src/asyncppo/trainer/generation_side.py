"""The generation side of a run as the driver sees it: which weights the generators hold, their sampling seeds,
and what their engines report.

    publish(version, trained)   push the policy to the generators (non-colocated: the GeneratorSupervisor, which
                                also restarts a generator that dies) or only set the version (colocated: the
                                engine reads the trainer's own weights); generation/restarts with it
    trainer_idle()              the driver only waits for rollouts meanwhile: a restarted generator may get the
                                published weights then
    reseed(step, offset)        the step's sampling seed, through the batch source (sync runs reseed; async
                                sources leave the engines alone)
    engine_metrics()            prefix reuse since the previous call, summed over generator ranks

Built by `trainer/build.py`; the loop (trainer/loop.py) and validation (trainer/validation.py) call it.
"""

from collections.abc import Callable, Generator
from contextlib import contextmanager
from dataclasses import dataclass, field

from asyncppo.generation.engines import prefix_reuse_metrics
from asyncppo.workers.generator_group import GeneratorGroup
from asyncppo.workers.generator_supervisor import GeneratorSupervisor

SEED_STRIDE = 7919
"""Seeds of consecutive steps differ by this prime: ppo.seed + SEED_STRIDE * step (+ an offset per purpose)."""


class PublishedVersion:
    """The weight version the generators hold (set on every publish); gym rollouts stamp it on trajectories."""

    def __init__(self) -> None:
        self.value = 0


@dataclass
class GenerationSide:
    """The run's generators, as the driver publishes weights to them, reseeds them and reads their counters."""

    generator: GeneratorGroup
    supervisor: GeneratorSupervisor | None
    """Pushes the weights and restarts dead generators; None when generation is colocated (nothing to push)."""
    reseed_source: Callable[[int], None]
    """The batch source's `reseed_generation`."""
    seed: int
    """ppo.seed."""
    published: PublishedVersion = field(default_factory=PublishedVersion)
    keeps_counters: bool = True
    """False when every engine is `hf` (no prefix cache, no counters): the per-step read is skipped, since in
    async runs it queues behind the generators' busy request threads."""
    counters: dict[str, float] = field(default_factory=dict[str, float])
    """The generators' summed engine counters at the last `engine_metrics` call (the base of the next)."""

    def publish(self, version: int, trained: bool) -> dict[str, float]:
        """Make generation use the policy of `version`: a push (non-colocated) or just the version (colocated)."""
        metrics: dict[str, float] = {}
        if self.supervisor is None:
            self.generator.set_policy_version(version)
        else:
            report = self.supervisor.publish(version, trained)
            if report is not None:
                metrics = {"timing/weight_sync": report.seconds, "weight_sync/bytes": float(report.num_bytes)}
            metrics["generation/restarts"] = float(self.supervisor.restarts)  # cumulative since the run started
        self.published.value = version
        return metrics

    @contextmanager
    def trainer_idle(self) -> Generator[None]:
        """Wrap what the driver does while the trainer only waits for rollouts (a step's batch, a validation): a
        generator restarted meanwhile gets the published weights (the trainer's own, unchanged) and serves."""
        if self.supervisor is None:
            yield
            return
        with self.supervisor.trainer_idle():
            yield

    def reseed(self, step: int, offset: int = 0) -> None:
        """Per-step sampling seed: a resumed sync run draws exactly what an uninterrupted one would."""
        self.reseed_source(self.seed + SEED_STRIDE * step + offset)

    def engine_metrics(self) -> dict[str, float]:
        """The engines' prefix reuse since the previous call, summed over generator ranks ({} for hf engines).

        Deltas of cumulative counters, so whatever generated in between counts: the step's rollouts, its
        validation and, in async runs, rollouts the collector produced for later steps.
        """
        if not self.keeps_counters:
            return {}
        counters = self.generator.engine_counters()
        metrics = prefix_reuse_metrics(self.counters, counters)
        self.counters = counters
        return metrics
