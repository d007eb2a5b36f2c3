"""The ServingFront every backend sits behind: closing with cancelled requests, failing turns, a dying thread,
weight versions; once per real backend (hf, graph, replay, built through the registry) and once over a fake core."""

import threading
from collections.abc import Iterator, Sequence
from concurrent.futures import Future
from pathlib import Path

import pytest
import torch
from transformers import PreTrainedModel

from asyncppo.generation.engines import BACKENDS, EngineSettings, build_engine
from asyncppo.generation.protocol import (
    GenerationRequest,
    GenerationResult,
    Generator,
    GeneratorClosedError,
    SamplingParams,
)
from asyncppo.generation.replay_generator import write_recording
from asyncppo.generation.serving_front import ServingFront, Submission
from asyncppo.models.policy import load_policy
from asyncppo.models.tiny import EOS_TOKEN_ID, PAD_TOKEN_ID

PROMPTS = [(11, 12, 13), (21, 22), (31, 32, 33, 34)]


def requests() -> list[GenerationRequest]:
    return [GenerationRequest(prompt, SamplingParams(max_new_tokens=4)) for prompt in PROMPTS]


@pytest.fixture(scope="module")
def policy(tiny_dir: Path) -> PreTrainedModel:
    return load_policy(tiny_dir)


@pytest.fixture(params=sorted(BACKENDS))
def engine(request: pytest.FixtureRequest, policy: PreTrainedModel, tmp_path: Path) -> Iterator[Generator]:
    """Each registered backend, built the way the workers build theirs (replay answers from a made-up recording)."""
    recording = tmp_path / "recording.jsonl"
    made_up = [GenerationResult((40, 41), (-0.5, -0.25), "length", 0, 0) for _ in PROMPTS]
    write_recording(recording, requests(), made_up)
    settings = EngineSettings(
        4, 64, 0, (EOS_TOKEN_ID,), PAD_TOKEN_ID, backend=request.param, replay_path=str(recording)
    )
    generator = build_engine(policy, settings)
    yield generator
    generator.close()


def test_closing_with_a_cancelled_queued_request_fails_the_others_and_raises_nothing(engine: Generator) -> None:
    engine.pause()
    first, cancelled, last = (engine.submit(request) for request in requests())
    assert cancelled.cancel()
    engine.close()
    assert cancelled.cancelled()
    for future in (first, last):
        with pytest.raises(GeneratorClosedError, match="was closed before this request ran"):
            future.result(timeout=5)
    with pytest.raises(GeneratorClosedError, match="is closed; no new requests are served"):
        engine.submit(requests()[0]).result(timeout=5)


def test_closing_with_requests_admitted_but_not_run_fails_them_and_raises_nothing(engine: Generator) -> None:
    engine.pause()
    first, cancelled, last = (engine.submit(request) for request in requests())
    cancelled.cancel()
    engine.reseed(1)  # admits what is queued: graph into its waiting line, hf and replay into the next batch
    engine.close()
    assert cancelled.cancelled()
    for future in (first, last):
        with pytest.raises(GeneratorClosedError, match="closed while this request ran"):
            future.result(timeout=5)


def test_a_request_cancelled_in_the_graph_engines_waiting_line_is_dropped_on_close(policy: PreTrainedModel) -> None:
    engine = build_engine(policy, EngineSettings(4, 64, 0, (EOS_TOKEN_ID,), PAD_TOKEN_ID, backend="graph"))
    engine.pause()
    futures = [engine.submit(request) for request in requests()]
    engine.reseed(1)  # in the engine's waiting line now, still cancellable: no slot was taken yet
    assert futures[1].cancel()
    engine.close()
    assert futures[1].cancelled() and all(
        isinstance(f.exception(timeout=5), GeneratorClosedError) for f in futures[::2]
    )


def test_too_many_stop_ids_fail_at_submit_so_a_cancel_cannot_stop_the_graph_engine(policy: PreTrainedModel) -> None:
    # Were they refused at admission on the serving thread instead, cancelling such a request would make setting
    # its error raise there and lose the requests admitted with it.
    engine = build_engine(policy, EngineSettings(4, 64, 0, (EOS_TOKEN_ID,), PAD_TOKEN_ID, backend="graph"))
    engine.pause()
    many_stops = SamplingParams(max_new_tokens=4, stop_token_ids=tuple(range(20, 30)))
    refused = engine.submit(GenerationRequest(PROMPTS[0], many_stops))
    other = engine.submit(requests()[1])
    assert not refused.cancel()  # already failed
    engine.resume()
    with pytest.raises(ValueError, match="at most 8 stop ids"):
        refused.result(timeout=5)
    assert len(other.result(timeout=30).token_ids) >= 1
    engine.close()


def test_every_backend_serves_and_tags_results_with_the_version_it_was_given(engine: Generator) -> None:
    engine.set_policy_version(3)
    results = engine.generate(requests())
    assert [len(result.token_ids) for result in results] == [len(result.logprobs) for result in results]
    assert all(1 <= len(result.token_ids) <= 4 for result in results)
    assert {(result.policy_version, result.last_policy_version) for result in results} == {(3, 3)}
    assert engine.policy_version == 3


def test_an_unknown_backend_is_refused_naming_the_known_ones(policy: PreTrainedModel) -> None:
    with pytest.raises(ValueError, match="'vllm' is not one of auto, hf, graph, replay"):
        build_engine(policy, EngineSettings(4, 64, 0, (EOS_TOKEN_ID,), PAD_TOKEN_ID, backend="vllm"))


def plain(prompt: tuple[int, ...]) -> GenerationRequest:
    return GenerationRequest(prompt, SamplingParams())


class FakeCore:
    """An EngineCore that answers a request with its prompt reversed, a batch of up to `batch` per step; a call
    named in `raise_in` raises `error` (once)."""

    def __init__(self, batch: int = 8, raise_in: str = "", error: BaseException | None = None) -> None:
        self.batch, self.raise_in, self.error = batch, raise_in, error
        self.held: list[Submission] = []
        self.version = 0
        self.seeds: list[int] = []

    def _maybe_raise(self, call: str) -> None:
        if self.raise_in == call and self.error is not None:
            self.raise_in = ""
            raise self.error

    def request_problem(self, request: GenerationRequest) -> str | None:
        return None if request.prompt_token_ids else "empty"

    def admission_limit(self) -> int | None:
        return self.batch - len(self.held)

    def admit(self, submissions: Sequence[Submission]) -> None:
        self.held.extend(s for s in submissions if s[1].set_running_or_notify_cancel())
        self._maybe_raise("admit")

    def has_work(self) -> bool:
        return bool(self.held)

    def step(self) -> None:
        self._maybe_raise("step")
        held, self.held = self.held, []
        for request, future in held:
            tokens = tuple(reversed(request.prompt_token_ids))
            future.set_result(GenerationResult(tokens, (0.0,) * len(tokens), "stop", self.version, self.version))

    def fail_all(self, error: BaseException) -> None:
        held, self.held = self.held, []
        for _, future in held:
            future.set_exception(error)

    def weights_changed(self, version: int, named_tensors: Sequence[tuple[str, torch.Tensor]] | None) -> None:
        if named_tensors is not None and not named_tensors:
            raise ValueError("load_weights: missing parameters")
        self.version = version

    def reseed(self, seed: int) -> None:
        self.seeds.append(seed)

    def counters(self) -> dict[str, float]:
        return {"versions_seen": float(self.version)}


def test_a_raising_turn_fails_only_its_requests_and_the_front_serves_on() -> None:
    core = FakeCore(batch=1, raise_in="admit", error=RuntimeError("admission broke"))
    front = ServingFront("Fake", core)
    front.pause()
    failed, served = front.submit_many(
        [GenerationRequest((1, 2), SamplingParams()), GenerationRequest((3, 4), SamplingParams())]
    )
    front.resume()
    with pytest.raises(RuntimeError, match="admission broke"):
        failed.result(timeout=5)
    assert served.result(timeout=5).token_ids == (4, 3)
    front.close()


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
def test_a_dying_serving_thread_fails_held_and_queued_requests_and_closes() -> None:
    core = FakeCore(batch=1, raise_in="step", error=SystemExit("killed"))
    front = ServingFront("Fake", core)
    front.pause()
    held, queued = front.submit_many(
        [GenerationRequest((1,), SamplingParams()), GenerationRequest((2,), SamplingParams())]
    )
    front.resume()
    with pytest.raises(SystemExit):
        held.result(timeout=5)
    with pytest.raises(GeneratorClosedError, match="the Fake serving thread died: SystemExit"):
        queued.result(timeout=5)
    with pytest.raises(GeneratorClosedError, match="is closed"):
        front.submit(plain((3,))).result(timeout=5)
    front.close()  # after the thread died: nothing left to do, nothing raised


def test_a_rejected_weight_update_keeps_the_old_version_and_a_good_one_tags_later_results() -> None:
    front = ServingFront("Fake", FakeCore(), policy_version=2)
    with pytest.raises(ValueError, match="missing parameters"):
        front.load_weights([], version=3)
    assert front.policy_version == 2
    front.load_weights([("weight", torch.zeros(1))], version=4)
    assert (
        front.policy_version == 4 and front.generate([GenerationRequest((5,), SamplingParams())])[0].policy_version == 4
    )
    assert front.counters() == {"versions_seen": 4.0}
    front.close()


def test_validation_errors_fail_at_submit_and_submissions_keep_their_order() -> None:
    front = ServingFront("Fake", FakeCore(batch=2))
    futures = front.submit_many([plain(())] + [plain((n, n + 1)) for n in range(5)])
    with pytest.raises(ValueError, match="empty"):
        futures[0].result(timeout=5)
    assert [future.result(timeout=5).token_ids for future in futures[1:]] == [(n + 1, n) for n in range(5)]
    front.close()


def test_pause_holds_turns_and_a_reseed_admits_what_was_queued_before_it() -> None:
    core = FakeCore(batch=8)
    front = ServingFront("Fake", core)
    front.pause()
    future: Future[GenerationResult] = front.submit(plain((7, 8)))
    front.reseed(5)
    assert len(core.held) == 1 and core.seeds == [5] and not future.done()  # admitted, not run: still paused
    front.resume()
    assert future.result(timeout=5).token_ids == (8, 7)
    front.close()


def test_close_from_a_done_callback_on_the_serving_thread_does_not_deadlock() -> None:
    front = ServingFront("Fake", FakeCore(batch=1))
    front.pause()
    first, second = front.submit_many(
        [GenerationRequest((1,), SamplingParams()), GenerationRequest((2,), SamplingParams())]
    )
    first.add_done_callback(lambda _: front.close())  # runs on the serving thread, inside its turn
    front.resume()
    assert first.result(timeout=5).token_ids == (1,)
    with pytest.raises(GeneratorClosedError):
        second.result(timeout=5)
    closed = threading.Event()
    threading.Thread(target=lambda: (front.close(), closed.set())).start()
    assert closed.wait(timeout=5)
