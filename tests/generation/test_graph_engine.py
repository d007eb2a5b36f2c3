"""The graph engine on CPU (eager: no compile, no graphs): exact tokens and logprobs, continuous batching,
per-request seeds, weight swaps mid-flight, prefix reuse and the limits it refuses."""

import time
from collections.abc import Iterator
from concurrent.futures import Future
from pathlib import Path

import pytest
import torch
from transformers import GPT2Config, GPT2LMHeadModel, PreTrainedModel

from asyncppo.generation.decoder_weights import UnsupportedModelError
from asyncppo.generation.engines import EngineSettings, build_engine
from asyncppo.generation.graph_engine import GraphEngine
from asyncppo.generation.graph_generator import GraphGenerator, graph_engine_settings
from asyncppo.generation.graph_settings import GraphEngineSettings
from asyncppo.generation.hf_generator import HFGenerator
from asyncppo.generation.protocol import GenerationRequest, GenerationResult, SamplingParams
from asyncppo.models.policy import load_policy, token_logprobs
from asyncppo.models.tiny import EOS_TOKEN_ID, PAD_TOKEN_ID

NEVER_SAMPLED = 10_000  # an EOS id outside the vocabulary: generations run to their length limit


@pytest.fixture(scope="module")
def policy(tiny_dir: Path) -> PreTrainedModel:
    return load_policy(tiny_dir)


def settings(**overrides: object) -> GraphEngineSettings:
    values: dict[str, object] = {
        "max_batch_size": 8,
        "max_context_length": 256,
        "eos_token_ids": (EOS_TOKEN_ID,),
        "seed": 0,
    }
    return GraphEngineSettings(**(values | overrides))  # pyright: ignore[reportArgumentType]


@pytest.fixture
def engine(policy: PreTrainedModel) -> Iterator[GraphGenerator]:
    generator = GraphGenerator(policy, settings())
    yield generator
    generator.close()


def mixed_prompts(count: int, seed: int, longest: int = 60) -> list[tuple[int, ...]]:
    draw = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, longest, (count,), generator=draw).tolist()
    return [tuple(torch.randint(9, 300, (n,), generator=draw).tolist()) for n in lengths]


def teacher_forced(model: PreTrainedModel, prompt: tuple[int, ...], result: GenerationResult, temperature: float):
    ids = torch.tensor([prompt + result.token_ids])
    with torch.no_grad():
        return token_logprobs(model, ids, torch.ones_like(ids), temperature)[0, len(prompt) :]


def run_until_done(engine: GraphEngine, futures: list["Future[GenerationResult]"]) -> list[GenerationResult]:
    for _ in range(10_000):
        if all(future.done() for future in futures):
            return [future.result() for future in futures]
        engine.step()
    raise AssertionError("the engine did not finish its requests in 10,000 steps")


def test_greedy_tokens_are_identical_to_the_hf_engine_on_mixed_lengths(
    policy: PreTrainedModel, engine: GraphGenerator
) -> None:
    prompts = mixed_prompts(32, seed=1)
    requests = [
        GenerationRequest(p, SamplingParams(greedy=True, max_new_tokens=3 + i % 29)) for i, p in enumerate(prompts)
    ]
    hf = HFGenerator(policy, [EOS_TOKEN_ID], PAD_TOKEN_ID, 8, "cpu", 0, 256)
    expected = hf.generate(requests)
    hf.close()
    got = engine.generate(requests)
    assert [r.token_ids for r in got] == [r.token_ids for r in expected]
    assert [r.finish_reason for r in got] == [r.finish_reason for r in expected]
    # 32 requests through at most 8 running rows: continuous batching refilled freed slots.
    stats = engine.stats()
    assert stats.decode_rows / stats.decode_steps <= 8 and stats.num_requests == 32


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_sampled_logprobs_equal_a_teacher_forced_forward(
    policy: PreTrainedModel, engine: GraphGenerator, temperature: float
) -> None:
    prompts = mixed_prompts(12, seed=2)
    sampling = SamplingParams(temperature=temperature, max_new_tokens=40, ignore_eos=True)
    results = engine.generate([GenerationRequest(p, sampling) for p in prompts])
    for prompt, result in zip(prompts, results, strict=True):
        assert len(result.token_ids) == 40 and result.finish_reason == "length"
        expected = teacher_forced(policy, prompt, result, temperature)
        torch.testing.assert_close(torch.tensor(result.logprobs), expected, rtol=0, atol=1e-5)


def test_a_seeded_request_gives_the_same_tokens_alone_and_joining_or_leaving_mid_decode(
    policy: PreTrainedModel,
) -> None:
    target = GenerationRequest(mixed_prompts(1, seed=3)[0], SamplingParams(max_new_tokens=30, seed=1234))
    alone = GraphEngine(policy, settings())
    future: Future[GenerationResult] = Future()
    alone.add(target, future)
    expected = run_until_done(alone, [future])[0]

    crowded = GraphEngine(policy, settings(max_batch_size=4))
    others = [GenerationRequest(p, SamplingParams(max_new_tokens=5 + 7 * i)) for i, p in enumerate(mixed_prompts(9, 4))]
    futures: list[Future[GenerationResult]] = []
    for other in others[:5]:  # more than fit: some wait, others leave early and free their slots
        futures.append(Future())
        crowded.add(other, futures[-1])
    for _ in range(7):
        crowded.step()
    futures.append(Future())
    crowded.add(target, futures[-1])  # joins while others decode
    for other in others[5:]:
        crowded.step()
        futures.append(Future())
        crowded.add(other, futures[-1])
    got = run_until_done(crowded, futures)[5]
    assert got.token_ids == expected.token_ids
    assert got.logprobs == pytest.approx(expected.logprobs, abs=1e-5)


def test_several_decode_steps_per_host_sync_give_the_same_results_as_one(policy: PreTrainedModel) -> None:
    # Rows that stop on a stop token inside a group of steps idle to its end; nothing of theirs may change.
    stops = (20, 21, 22, 23, 24)
    requests = [
        GenerationRequest(p, SamplingParams(max_new_tokens=5 + 3 * i, stop_token_ids=stops))
        for i, p in enumerate(mixed_prompts(16, seed=11))
    ]
    outcomes = []
    for steps_per_sync in (1, 8):
        engine = GraphEngine(policy, settings(max_batch_size=8, max_decode_steps_per_sync=steps_per_sync))
        futures: list[Future[GenerationResult]] = [Future() for _ in requests]
        for request, future in zip(requests, futures, strict=True):
            engine.add(request, future)
        outcomes.append(run_until_done(engine, futures))
    one, grouped = outcomes
    assert any(r.finish_reason == "stop" for r in one) and any(r.finish_reason == "length" for r in one)
    assert [(r.token_ids, r.finish_reason) for r in grouped] == [(r.token_ids, r.finish_reason) for r in one]
    assert [r.logprobs for r in grouped] == [pytest.approx(r.logprobs, abs=1e-5) for r in one]


def test_requests_without_a_seed_are_reproducible_after_reseeding(engine: GraphGenerator) -> None:
    requests = [GenerationRequest(p, SamplingParams(max_new_tokens=12)) for p in mixed_prompts(6, seed=5)]
    engine.reseed(7)
    first = engine.generate(requests)
    engine.reseed(7)
    second = engine.generate(requests)
    engine.reseed(8)
    third = engine.generate(requests)
    assert [r.token_ids for r in first] == [r.token_ids for r in second]
    assert [r.token_ids for r in first] != [r.token_ids for r in third]


def perturbed_copy(policy: PreTrainedModel, tiny_dir: Path) -> PreTrainedModel:
    other = load_policy(tiny_dir)
    with torch.no_grad():
        for parameter in other.parameters():
            parameter.add_(torch.randn_like(parameter) * 0.05)
    return other


@pytest.mark.parametrize("recompute", [False, True])
def test_a_weight_swap_mid_flight_records_first_and_last_versions(tiny_dir: Path, recompute: bool) -> None:
    model = load_policy(tiny_dir)
    new_weights = perturbed_copy(model, tiny_dir)
    # One decode step per engine step, so the swap lands after exactly 10 tokens.
    engine = GraphEngine(model, settings(recompute_kv_after_weight_update=recompute, max_decode_steps_per_sync=1))
    prompts = mixed_prompts(4, seed=6)
    futures: list[Future[GenerationResult]] = [Future() for _ in prompts]
    for prompt, future in zip(prompts, futures, strict=True):
        engine.add(GenerationRequest(prompt, SamplingParams(max_new_tokens=30, ignore_eos=True)), future)
    for _ in range(10):
        engine.step()
    model.load_state_dict(new_weights.state_dict())
    engine.weights_changed(1, model)
    results = run_until_done(engine, futures)
    assert [(r.policy_version, r.last_policy_version) for r in results] == [(0, 1)] * 4
    if recompute:
        assert engine.stats.recomputed_rows == 4
        # After the swap every token, and the KV it attends to, comes from the new weights.
        for prompt, result in zip(prompts, results, strict=True):
            swapped_at = len(result.token_ids) - 20
            expected = teacher_forced(new_weights, prompt, result, 1.0)[swapped_at:]
            torch.testing.assert_close(torch.tensor(result.logprobs[swapped_at:]), expected, rtol=0, atol=1e-5)


def test_load_weights_copies_into_the_model_and_the_engine(tiny_dir: Path) -> None:
    model = load_policy(tiny_dir)
    new_weights = perturbed_copy(model, tiny_dir)
    engine = GraphGenerator(model, settings())
    try:
        engine.load_weights(new_weights.named_parameters(), version=3)
        prompt = mixed_prompts(1, seed=7)[0]
        result = engine.generate([GenerationRequest(prompt, SamplingParams(max_new_tokens=10, ignore_eos=True))])[0]
        assert engine.policy_version == 3 and result.policy_version == 3
        torch.testing.assert_close(
            torch.tensor(result.logprobs), teacher_forced(new_weights, prompt, result, 1.0), rtol=0, atol=1e-5
        )
        with pytest.raises(ValueError, match="missing parameters"):
            engine.load_weights(list(new_weights.named_parameters())[:3], version=4)
        assert engine.policy_version == 3
    finally:
        engine.close()


def test_a_multi_turn_history_reuses_the_resident_prefix(policy: PreTrainedModel) -> None:
    first = mixed_prompts(1, seed=8, longest=80)[0]
    with_cache = GraphGenerator(policy, settings())
    without_cache = GraphGenerator(policy, settings(prefix_cache=False))
    try:
        turn = SamplingParams(greedy=True, max_new_tokens=20, ignore_eos=True)
        reply = with_cache.generate([GenerationRequest(first, turn)])[0]
        second = first + reply.token_ids + (40, 41, 42, 43)  # history + the reply + a tool result
        sent_before = with_cache.stats().prefill_tokens_computed
        got = with_cache.generate([GenerationRequest(second, turn)])[0]
        stats = with_cache.stats()
        # Only the tool result and the reply's last token (sampled but never fed back) are computed again.
        assert stats.prefill_tokens_computed - sent_before == 5 and stats.prefix_hits == 1
        assert got.token_ids == without_cache.generate([GenerationRequest(second, turn)])[0].token_ids
        torch.testing.assert_close(
            torch.tensor(got.logprobs), teacher_forced(policy, second, got, 1.0), rtol=0, atol=1e-5
        )
        # New weights: the resident KV is stale and must not be reused.
        with_cache.set_policy_version(1)
        with_cache.generate([GenerationRequest(second, turn)])
        assert with_cache.stats().prefix_hits == 1
    finally:
        with_cache.close()
        without_cache.close()


def test_stop_tokens_end_a_request_and_the_context_limit_ends_it_by_length(policy: PreTrainedModel) -> None:
    engine = GraphGenerator(policy, settings(max_context_length=40))
    try:
        probe = engine.generate([GenerationRequest((9, 10, 11), SamplingParams(greedy=True, max_new_tokens=8))])[0]
        stop_at = probe.token_ids[3]
        stopped = engine.generate(
            [GenerationRequest((9, 10, 11), SamplingParams(greedy=True, max_new_tokens=8, stop_token_ids=(stop_at,)))]
        )[0]
        assert (
            stopped.finish_reason == "stop"
            and stopped.token_ids == probe.token_ids[: probe.token_ids.index(stop_at) + 1]
        )
        long = engine.generate(
            [GenerationRequest(tuple(range(9, 39)), SamplingParams(max_new_tokens=100, ignore_eos=True))]
        )[0]
        assert long.finish_reason == "length" and len(long.token_ids) == 10  # 30 prompt + 10 = the 40-token context
        with pytest.raises(ValueError, match="leaves no room"):
            engine.generate([GenerationRequest(tuple(range(9, 49)), SamplingParams())])
    finally:
        engine.close()


def test_unsupported_families_and_a_too_small_cache_are_refused_with_the_way_out() -> None:
    gpt2 = GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=50))
    with pytest.raises(UnsupportedModelError, match=r"generation\.backend: hf"):
        GraphGenerator(gpt2, settings())
    hf = build_engine(gpt2, EngineSettings(4, 64, 0, (1,), 0, backend="auto"))  # auto on CPU: hf, no complaint
    assert isinstance(hf, HFGenerator)
    hf.close()


def test_graph_settings_take_every_shared_engine_setting_and_the_rank_seed() -> None:
    engine = EngineSettings(
        max_batch_size=3,
        max_context_length=96,
        seed=7,
        eos_token_ids=(1, 2),
        pad_token_id=0,
        backend="graph",
        gpu_memory_utilization=0.3,
        kv_cache_tokens=512,
        prefix_cache=False,
        recompute_kv_after_weight_update=True,
    )
    assert graph_engine_settings(engine, seed=1007) == GraphEngineSettings(
        max_batch_size=3,
        max_context_length=96,
        eos_token_ids=(1, 2),
        seed=1007,
        kv_cache_tokens=512,
        gpu_memory_utilization=0.3,
        prefix_cache=False,
        recompute_kv_after_weight_update=True,
    )


def test_a_kv_cache_smaller_than_the_batch_is_refused_naming_the_keys(policy: PreTrainedModel) -> None:
    with pytest.raises(ValueError, match="max_batch_size=8"):
        GraphGenerator(policy, settings(kv_cache_tokens=4 * 256))


def test_pause_stops_at_a_step_boundary_and_resume_continues(engine: GraphGenerator) -> None:
    futures = engine.submit_many(
        [GenerationRequest(p, SamplingParams(max_new_tokens=180, ignore_eos=True)) for p in mixed_prompts(3, 9)]
    )
    engine.pause()
    steps = engine.stats().decode_steps
    time.sleep(0.3)
    assert engine.stats().decode_steps == steps  # nothing runs while paused
    assert not any(future.done() for future in futures)  # 180 tokens take more steps than ran before the pause
    engine.resume()
    assert all(len(future.result(timeout=60).token_ids) == 180 for future in futures)
