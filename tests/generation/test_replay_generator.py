"""The replay backend: a recording of the hf engine's results, answered back token- and logprob-exact through the
registry, with groups of one prompt cycling through its recordings, budgets cutting them, and bad input refused."""

from pathlib import Path

import pytest
from transformers import PreTrainedModel

from asyncppo.generation.engines import EngineSettings, build_engine
from asyncppo.generation.protocol import GenerationRequest, GenerationResult, SamplingParams
from asyncppo.generation.replay_generator import ReplayGenerator, read_recording, write_recording
from asyncppo.models.policy import load_policy
from asyncppo.models.tiny import EOS_TOKEN_ID, PAD_TOKEN_ID

GROUP_PROMPT = (40, 41, 42)


@pytest.fixture(scope="module")
def policy(tiny_dir: Path) -> PreTrainedModel:
    return load_policy(tiny_dir)


def settings(backend: str, replay_path: Path | None = None) -> EngineSettings:
    replay = None if replay_path is None else str(replay_path)
    return EngineSettings(8, 64, 0, (EOS_TOKEN_ID,), PAD_TOKEN_ID, backend=backend, replay_path=replay)


def sampled_requests() -> list[GenerationRequest]:
    """A group of 3 samples of one prompt, then two other prompts."""
    sampling = SamplingParams(max_new_tokens=6)
    return [GenerationRequest(GROUP_PROMPT, sampling)] * 3 + [
        GenerationRequest((50, 51), sampling),
        GenerationRequest((60, 61, 62, 63), sampling),
    ]


@pytest.fixture(scope="module")
def recorded(policy: PreTrainedModel, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[GenerationResult]]:
    """The hf engine's results for sampled_requests(), and the recording of them."""
    hf = build_engine(policy, settings("hf"))
    results = hf.generate(sampled_requests())
    hf.close()
    path = tmp_path_factory.mktemp("replay") / "recording.jsonl"
    write_recording(path, sampled_requests(), results)
    return path, results


def test_a_replay_gives_back_the_recorded_tokens_logprobs_and_finish_reasons(
    policy: PreTrainedModel, recorded: tuple[Path, list[GenerationResult]]
) -> None:
    path, expected = recorded
    replay = build_engine(policy, settings("replay", path))
    assert isinstance(replay, ReplayGenerator)
    got = replay.generate(sampled_requests())
    replay.close()
    assert [(r.token_ids, r.logprobs, r.finish_reason) for r in got] == [
        (r.token_ids, r.logprobs, r.finish_reason) for r in expected
    ]
    assert len({r.token_ids for r in got[:3]}) > 1  # the group's samples differ, as the recording's did


def test_a_group_cycles_through_its_recordings_and_a_reseed_starts_it_over(
    policy: PreTrainedModel, recorded: tuple[Path, list[GenerationResult]]
) -> None:
    path, expected = recorded
    replay = build_engine(policy, settings("replay", path))
    one = GenerationRequest(GROUP_PROMPT, SamplingParams(max_new_tokens=6))
    # 4 requests for a prompt recorded 3 times: the 4th gets the 1st recording again.
    cycled = [replay.generate([one])[0].token_ids for _ in range(4)]
    replay.reseed(1)
    again = replay.generate([one])[0].token_ids
    replay.close()
    assert cycled == [r.token_ids for r in expected[:3]] + [expected[0].token_ids]
    assert again == expected[0].token_ids


def test_a_smaller_budget_cuts_the_recording_and_finishes_by_length(tmp_path: Path) -> None:
    path = tmp_path / "recording.jsonl"
    request = GenerationRequest((5, 6), SamplingParams(max_new_tokens=8))
    write_recording(path, [request], [GenerationResult((7, 8, 9, 2), (-0.1, -0.2, -0.3, -0.4), "stop", 0, 0)])
    replay = ReplayGenerator(path, max_batch_size=4, max_context_length=64)
    [whole, cut] = replay.generate([request, GenerationRequest((5, 6), SamplingParams(max_new_tokens=2))])
    replay.close()
    assert (whole.token_ids, whole.finish_reason) == ((7, 8, 9, 2), "stop")
    assert (cut.token_ids, cut.logprobs, cut.finish_reason) == ((7, 8), (-0.1, -0.2), "length")


def test_a_prompt_without_a_recording_fails_at_submit_naming_the_file(
    recorded: tuple[Path, list[GenerationResult]],
) -> None:
    path, _ = recorded
    replay = ReplayGenerator(path, max_batch_size=4, max_context_length=64)
    future = replay.submit(GenerationRequest((1, 2, 3), SamplingParams()))
    replay.close()
    with pytest.raises(ValueError, match=r"recording\.jsonl has no recording of this prompt \(3 tokens"):
        future.result(timeout=5)


def test_a_malformed_recording_and_a_missing_path_are_refused(policy: PreTrainedModel, tmp_path: Path) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text('{"prompt_token_ids": [1], "token_ids": [2], "logprobs": [-1.0], "finish_reason": "stop"}\n{}\n')
    with pytest.raises(ValueError, match=r"bad\.jsonl:2: not a recorded request"):
        read_recording(path)
    path.write_text('{"prompt_token_ids": [1], "token_ids": [2, 3], "logprobs": [-1.0], "finish_reason": "stop"}\n')
    with pytest.raises(ValueError, match=r"bad\.jsonl:1: needs at least one token and one logprob per token"):
        read_recording(path)
    with pytest.raises(ValueError, match=r"replay backend needs EngineSettings\.replay_path"):
        build_engine(policy, settings("replay"))
