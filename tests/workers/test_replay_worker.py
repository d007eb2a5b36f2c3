"""The replay backend behind the real workers: a GeneratorWorker and a colocated PolicyWorker built with
`backend="replay"` answer with what an hf GeneratorWorker generated, through the same build path and calls."""

from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from asyncppo.generation.engines import EngineSettings
from asyncppo.generation.protocol import GenerationRequest, GenerationResult, SamplingParams
from asyncppo.generation.replay_generator import write_recording
from asyncppo.models.tiny import EOS_TOKEN_ID, PAD_TOKEN_ID
from asyncppo.workers.generator_worker import load_generator_worker
from asyncppo.workers.policy_worker import PolicyWorker

REQUESTS = [
    GenerationRequest((20, 21, 22), SamplingParams(max_new_tokens=5)),
    GenerationRequest((30, 31), SamplingParams(max_new_tokens=5)),
]


def engine_settings(backend: str, replay_path: Path | None = None) -> EngineSettings:
    replay = None if replay_path is None else str(replay_path)
    return EngineSettings(4, 128, 0, (EOS_TOKEN_ID,), PAD_TOKEN_ID, backend=backend, replay_path=replay)


@pytest.fixture
def recorded(tiny_dir: Path, tmp_path: Path) -> tuple[Path, list[GenerationResult]]:
    """What an hf GeneratorWorker generates for REQUESTS, and its recording."""
    hf = load_generator_worker(str(tiny_dir), torch.float32, "cpu", engine_settings("hf"), rank=0)
    try:
        results = hf.generate(REQUESTS)
    finally:
        hf.close()
    write_recording(tmp_path / "recording.jsonl", REQUESTS, results)
    return tmp_path / "recording.jsonl", results


def test_a_replay_generator_worker_answers_what_the_hf_worker_generated(
    tiny_dir: Path, recorded: tuple[Path, list[GenerationResult]]
) -> None:
    path, expected = recorded
    worker = load_generator_worker(str(tiny_dir), torch.float32, "cpu", engine_settings("replay", path), rank=1)
    try:
        worker.reseed(3)
        worker.set_policy_version(2)
        got = worker.generate(REQUESTS)
        assert worker.policy_version() == 2
        assert worker.engine_counters() == {}  # no prefix cache: nothing to report
    finally:
        worker.close()
    assert [(r.token_ids, r.logprobs, r.finish_reason) for r in got] == [
        (r.token_ids, r.logprobs, r.finish_reason) for r in expected
    ]
    assert {(r.policy_version, r.last_policy_version) for r in got} == {(2, 2)}


def test_a_colocated_replay_engine_serves_through_the_policy_worker(
    make_policy: Callable[..., PolicyWorker], recorded: tuple[Path, list[GenerationResult]]
) -> None:
    path, expected = recorded
    worker = make_policy(colocated_engine=engine_settings("replay", path))
    try:
        got = worker.generate(REQUESTS)
    finally:
        worker.close()
    assert [r.token_ids for r in got] == [r.token_ids for r in expected]
