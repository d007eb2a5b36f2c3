"""Engine counters on their way to the step metrics: workers read them (graph: prefix reuse; hf: nothing), the
driver-side GeneratorGroup sums them over ranks and survives ranks that cannot answer, and two readings become
the step's `generation/*` deltas."""

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest
import torch

from asyncppo.generation.engines import EngineSettings, prefix_reuse_metrics
from asyncppo.generation.protocol import GenerationRequest, SamplingParams
from asyncppo.models.tiny import EOS_TOKEN_ID, PAD_TOKEN_ID
from asyncppo.workers.generator_group import GenerationWorker, GeneratorGroup
from asyncppo.workers.generator_worker import GeneratorWorker, load_generator_worker
from asyncppo.workers.policy_worker import PolicyWorker
from asyncppo.workers.ray_host import PendingCall, WorkerCallError, WorkerGroup

COUNTERS = {"prefill_tokens_sent", "prefill_tokens_computed", "prefix_hits"}


def engine_settings(backend: str) -> EngineSettings:
    return EngineSettings(4, 128, 0, (EOS_TOKEN_ID,), PAD_TOKEN_ID, backend=backend)  # pyright: ignore[reportArgumentType]


def two_turns(worker: GeneratorWorker | PolicyWorker) -> None:
    """A first turn, then a prompt that repeats it with the reply (a multi-turn history)."""
    turn = SamplingParams(greedy=True, max_new_tokens=6, ignore_eos=True)
    first = tuple(range(20, 40))
    reply = worker.generate([GenerationRequest(first, turn)])[0]
    worker.generate([GenerationRequest(first + reply.token_ids + (50, 51), turn)])


def test_a_graph_generator_worker_counts_the_prefill_its_prefix_cache_saves(tiny_dir: Path) -> None:
    worker = load_generator_worker(str(tiny_dir), torch.float32, "cpu", engine_settings("graph"), rank=0)
    try:
        assert worker.engine_counters() == dict.fromkeys(COUNTERS, 0.0)
        two_turns(worker)
        counters = worker.engine_counters()
    finally:
        worker.close()
    assert counters["prefill_tokens_sent"] == 20 + 28 and counters["prefix_hits"] == 1
    # The second prompt reuses the first turn's KV: only the reply's last token and the two new ones run again.
    assert counters["prefill_tokens_computed"] == 20 + 3


def test_an_hf_generator_and_a_policy_worker_without_one_report_no_counters(
    tiny_dir: Path, make_policy: Callable[..., PolicyWorker]
) -> None:
    hf = load_generator_worker(str(tiny_dir), torch.float32, "cpu", engine_settings("hf"), rank=0)
    try:
        two_turns(hf)
        assert hf.engine_counters() == {}  # hf has no prefix cache: no numbers to invent
    finally:
        hf.close()
    assert make_policy(colocated_engine=None).engine_counters() == {}


def test_a_colocated_graph_engine_reports_through_the_policy_worker(
    make_policy: Callable[..., PolicyWorker],
) -> None:
    worker = make_policy(colocated_engine=engine_settings("graph"))
    try:
        two_turns(worker)
        counters = worker.engine_counters()
    finally:
        worker.close()
    assert counters.keys() == COUNTERS and counters["prefix_hits"] == 1
    assert counters["prefill_tokens_computed"] < counters["prefill_tokens_sent"]


class FakeGroup(WorkerGroup[GenerationWorker]):
    """A WorkerGroup without Ray: each rank answers `engine_counters` from a list, or raises WorkerCallError."""

    def __init__(self, answers: Sequence[dict[str, float] | None]):
        super().__init__("generator", [None] * len(answers), timeout_s=3600.0)
        self.answers = list(answers)
        self.calls = 0

    def submit_all(self, method: Callable[..., Any], *args: Any, **kwargs: Any) -> list[PendingCall[Any]]:
        self.calls += 1
        return super().submit_all(method, *args, **kwargs)

    def submit(self, rank: int, method: Callable[..., Any], *args: Any, **kwargs: Any) -> PendingCall[Any]:
        assert method is GenerationWorker.engine_counters
        return PendingCall(ref=None, rank=rank, method=method.__name__)

    def gather(self, calls: Sequence[PendingCall[Any]], timeout_s: float | None = None) -> list[Any]:
        assert timeout_s is not None  # a stuck rank must not hold the driver for the group's hour-long timeout
        for call in calls:
            if self.answers[call.rank] is None:
                raise WorkerCallError(f"generator[{call.rank}].{call.method} failed: AttributeError: no such method")
        return [self.answers[call.rank] for call in calls]


def remote(group: FakeGroup) -> GeneratorGroup:
    return GeneratorGroup(group)


def test_remote_counters_are_summed_over_ranks_in_one_gathered_call() -> None:
    group = FakeGroup([{"prefill_tokens_sent": 10.0, "prefix_hits": 1.0}, {"prefill_tokens_sent": 5.0}])
    assert remote(group).engine_counters() == {"prefill_tokens_sent": 15.0, "prefix_hits": 1.0}
    assert group.calls == 1
    assert remote(FakeGroup([{}, {}])).engine_counters() == {}  # hf ranks


def test_a_rank_that_cannot_answer_turns_the_counters_off_instead_of_failing_the_run(
    caplog: pytest.LogCaptureFixture,
) -> None:
    group = FakeGroup([{"prefill_tokens_sent": 10.0}, None])
    generator = remote(group)
    assert generator.engine_counters() == {}
    assert generator.engine_counters() == {}
    assert group.calls == 1  # not asked again: one warning, no per-step retries
    assert "not reported from now on" in caplog.text


def test_step_metrics_are_deltas_with_the_computed_fraction_only_when_something_was_sent() -> None:
    first = {"prefill_tokens_sent": 100.0, "prefill_tokens_computed": 60.0, "prefix_hits": 3.0}
    assert prefix_reuse_metrics({}, first) == {
        "generation/prefill_tokens_sent": 100.0,
        "generation/prefill_tokens_computed": 60.0,
        "generation/prefix_hits": 3.0,
        "generation/prefill_computed_fraction": 0.6,
    }
    second = {"prefill_tokens_sent": 140.0, "prefill_tokens_computed": 70.0, "prefix_hits": 5.0}
    assert prefix_reuse_metrics(first, second)["generation/prefill_computed_fraction"] == pytest.approx(0.25)
    idle = prefix_reuse_metrics(second, second)
    assert idle["generation/prefill_tokens_sent"] == 0 and "generation/prefill_computed_fraction" not in idle
    assert prefix_reuse_metrics(first, {}) == {}  # hf engines: nothing logged
