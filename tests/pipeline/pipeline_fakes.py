"""Fakes for the pipeline tests: a list-backed prompt stream, a generator whose rollouts are instant, slow,
gated or failing, and a small driver loop that calls an AsyncBatchSource the way the real driver does."""

import random
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from asyncppo.pipeline.async_source import AsyncBatchSource
from asyncppo.pipeline.buffer import TrajectoryBuffer, default_buffer_size
from asyncppo.pipeline.collector import Collector
from asyncppo.pipeline.failures import StepFailureBudget
from asyncppo.pipeline.sources import GenerationHealth, GroupOutcome, GroupRolloutFn, PromptBatches, StepBatch
from asyncppo.pipeline.staleness import AgeSchedule
from asyncppo.types import MessageSpan, Trajectory

Row = dict[str, Any]


def make_trajectory(
    draw_id: int, sample_index: int = 0, version: int = 0, last_version: int | None = None, task: Row | None = None
) -> Trajectory:
    """A 2-token prompt + 2 generated tokens; the logprobs are not float32-representable, to catch rounding."""
    return Trajectory(
        token_ids=[5, 6, 7 + sample_index, 9],
        loss_mask=[0, 0, 1, 1],
        generation_logprobs=[0.0, 0.0, -0.1234567890123, -1 / 3],
        prompt_length=2,
        message_log=[MessageSpan("user", 2), MessageSpan("assistant", 2)],
        reward=0.5 + sample_index,
        group_id=draw_id,
        sample_index=sample_index,
        policy_version=version,
        last_policy_version=version if last_version is None else last_version,
        reward_components={"correct": 0.5},
        task=dict(task or {}),
    )


class ListPrompts:
    """PromptBatches over a list: each iter() is the rest of the current epoch; state = (epoch, position)."""

    def __init__(self, num_rows: int, batch_size: int) -> None:
        self.num_rows = num_rows
        self.batch_size = batch_size
        self.epoch = 0
        self.position = 0

    def __iter__(self) -> Iterator[list[Row]]:
        while self.position + self.batch_size <= self.num_rows:
            start = self.position
            self.position += self.batch_size
            yield [{"index": index, "epoch": self.epoch} for index in range(start, start + self.batch_size)]
        self.epoch += 1
        self.position = 0

    def state_dict(self) -> dict[str, Any]:
        return {"epoch": self.epoch, "position": self.position}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.epoch, self.position = state["epoch"], state["position"]


class FakeGenerator:
    """Rollouts tagged with the generator's weight version at their first and last token.

    `delay` maps a draw id to seconds to sleep; draw ids in `fail_on` fail (their outcome is the exception, or
    the call raises it with `raise_failures`); while `gate` is clear, rollouts (of the draw ids in `gated`, or
    all) wait for it (at most 10 s, so a broken test cannot hang)."""

    def __init__(
        self,
        group_size: int = 2,
        delay: Callable[[int], float] | None = None,
        fail_on: frozenset[int] = frozenset(),
        gate: threading.Event | None = None,
        gated: frozenset[int] | None = None,
        raise_failures: bool = False,
    ) -> None:
        self.group_size = group_size
        self.delay = delay
        self.fail_on = fail_on
        self.gate = gate
        self.gated = gated
        self.raise_failures = raise_failures
        self.version = 0
        self.started: list[int] = []
        self._lock = threading.Lock()

    def rollout(self, rows: Sequence[Row], draw_ids: Sequence[int]) -> list[GroupOutcome]:
        groups: list[GroupOutcome] = []
        for row, draw_id in zip(rows, draw_ids, strict=True):
            with self._lock:
                self.started.append(draw_id)
                first_version = self.version
            if self.gate is not None and (self.gated is None or draw_id in self.gated):
                self.gate.wait(timeout=10)
            if self.delay is not None:
                time.sleep(self.delay(draw_id))
            if draw_id in self.fail_on:
                failure = RuntimeError(f"boom on draw {draw_id}")
                if self.raise_failures:
                    raise failure
                groups.append(failure)
                continue
            last_version = self.version
            groups.append(
                [make_trajectory(draw_id, index, first_version, last_version, row) for index in range(self.group_size)]
            )
        return groups


def random_delay(seed: int, max_s: float) -> Callable[[int], float]:
    rng = random.Random(seed)
    lock = threading.Lock()

    def delay(_draw_id: int) -> float:
        with lock:
            return rng.uniform(0, max_s)

    return delay


@dataclass
class Setup:
    """One async pipeline built the way the driver's builder will build it."""

    source: AsyncBatchSource
    collector: Collector
    buffer: TrajectoryBuffer
    generator: FakeGenerator
    prompts: PromptBatches
    ages: AgeSchedule
    batches: dict[int, StepBatch] = field(default_factory=dict[int, StepBatch])


def build(
    prompts: PromptBatches,
    generator: FakeGenerator,
    *,
    num_prompts: int = 2,
    start_step: int = 0,
    ages: AgeSchedule | None = None,
    in_flight: bool = False,
    max_concurrent: int = 8,
    drop_incomplete: bool = True,
    watchdog_s: float = 5.0,
    max_size: int | None = None,
    idle_recheck_s: float = 0.5,
    failure_budget: StepFailureBudget | None = None,
    rollout: GroupRolloutFn | None = None,
    health: GenerationHealth | None = None,
) -> Setup:
    """`failure_budget` None: 0, the first failed group stops collection. `rollout`: instead of the generator's
    (which still holds the weight version)."""
    ages = ages or AgeSchedule(policy_training_start_step=0, train_age=1, warmup_age=1)
    buffer = TrajectoryBuffer(num_prompts, max_size or default_buffer_size(num_prompts, ages.max_age))
    collector = Collector(
        prompts,
        rollout or generator.rollout,
        buffer,
        initial_version=start_step,
        ages=ages,
        max_concurrent_groups=max_concurrent,
        in_flight_weight_updates=in_flight,
        drain_timeout_s=watchdog_s,
        idle_recheck_s=idle_recheck_s,
        failure_budget=failure_budget or StepFailureBudget(0, "max_failed_groups_per_step"),
        health=health,
    )
    source = AsyncBatchSource(
        collector,
        buffer,
        ages=ages,
        drop_incomplete_targets_on_restore=drop_incomplete,
        watchdog_timeout_s=watchdog_s,
        poll_interval_s=0.05,
    )
    generator.version = start_step
    return Setup(source, collector, buffer, generator, prompts, ages)


def run_steps(
    setup: Setup,
    steps: range,
    rng: random.Random | None = None,
    max_pause_s: float = 0.0,
    on_step_end: Callable[[int], None] | None = None,
) -> None:
    """The driver's per-step sequence: next_batch, train, then the push inside weight_update."""
    for step in steps:
        setup.batches[step] = setup.source.next_batch(step)
        if rng is not None:
            time.sleep(rng.uniform(0, max_pause_s))  # training
        with setup.source.weight_update(step + 1):
            if rng is not None:
                time.sleep(rng.uniform(0, max_pause_s))  # the weight push
            setup.generator.version = step + 1
        if on_step_end is not None:
            on_step_end(step)


def draw_ids_of(batch: StepBatch) -> list[int]:
    return sorted({trajectory.group_id for trajectory in batch.trajectories})


class GatedPrompts(ListPrompts):
    """ListPrompts whose every batch waits for `gate` (at most 10 s): a slow or stuck dataset."""

    def __init__(self, num_rows: int, batch_size: int, gate: threading.Event) -> None:
        super().__init__(num_rows, batch_size)
        self.gate = gate

    def __iter__(self) -> Iterator[list[Row]]:
        for batch in super().__iter__():
            self.gate.wait(timeout=10)
            yield batch


def wait_until(predicate: Callable[[], bool], timeout_s: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.005)
    return predicate()
