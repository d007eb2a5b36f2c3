"""HFGenerator on the tiny model: token-exact logprobs, stopping, shared batches, pause, weights and failures."""

import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from transformers import PreTrainedModel

from asyncppo.generation import hf_generator
from asyncppo.generation.hf_generator import HFGenerator
from asyncppo.generation.protocol import GenerationRequest, GenerationResult, GeneratorClosedError, SamplingParams
from asyncppo.models.policy import load_policy, token_logprobs
from asyncppo.models.tiny import EOS_TOKEN_ID, PAD_TOKEN_ID, TINY, build_tiny_model

NEVER_SAMPLED = 10_000  # an EOS id outside the vocabulary: generations run to their length limit


@pytest.fixture
def policy(tiny_dir: Path) -> PreTrainedModel:
    return load_policy(tiny_dir)


def make_engine(model: PreTrainedModel, **overrides: object) -> HFGenerator:
    arguments: dict[str, object] = {
        "eos_token_ids": [EOS_TOKEN_ID],
        "pad_token_id": PAD_TOKEN_ID,
        "max_batch_size": 64,
        "device": "cpu",
        "seed": 0,
        "max_context_length": 1024,
    }
    return HFGenerator(model, **(arguments | overrides))  # pyright: ignore[reportArgumentType]


@pytest.fixture
def engine(policy: PreTrainedModel) -> Iterator[HFGenerator]:
    generator = make_engine(policy)
    yield generator
    generator.close()


def prompt(length: int, offset: int = 0) -> tuple[int, ...]:
    """Byte-range token ids (9..299), distinct per offset."""
    return tuple(9 + (offset * 37 + 11 * position) % 290 for position in range(length))


def request(length: int, offset: int = 0, **sampling: object) -> GenerationRequest:
    return GenerationRequest(prompt(length, offset), SamplingParams(**sampling))  # pyright: ignore[reportArgumentType]


def recomputed_logprobs(
    model: PreTrainedModel, prompt_ids: tuple[int, ...], generated: tuple[int, ...], temperature: float
) -> torch.Tensor:
    ids = torch.tensor([prompt_ids + generated])
    with torch.no_grad():
        return token_logprobs(model, ids, torch.ones_like(ids), temperature)[0, len(prompt_ids) :]


@pytest.mark.parametrize("temperature", [0.7, 1.0])
def test_logprobs_match_a_fresh_forward_of_the_full_sequence_across_prompt_lengths(
    engine: HFGenerator, policy: PreTrainedModel, temperature: float
) -> None:
    requests = [
        request(length, offset, temperature=temperature, max_new_tokens=24)
        for offset, length in enumerate([1, 3, 17, 40, 8])
    ]
    results = engine.generate(requests)
    assert engine.stats().largest_batch_size == len(requests)  # one left-padded batch of mixed lengths
    for req, result in zip(requests, results, strict=True):
        assert len(result.token_ids) == len(result.logprobs) >= 1
        expected = recomputed_logprobs(policy, req.prompt_token_ids, result.token_ids, temperature)
        torch.testing.assert_close(torch.tensor(result.logprobs), expected, rtol=0, atol=1e-5)


def test_rows_with_different_sampling_params_share_a_batch_and_keep_their_own_temperature(
    engine: HFGenerator, policy: PreTrainedModel
) -> None:
    temperatures = [0.5, 1.0, 1.7]
    requests = [request(6 + 3 * i, i, temperature=t, max_new_tokens=10 + i) for i, t in enumerate(temperatures)]
    results = engine.generate(requests)
    assert engine.stats().num_batches == 1
    for req, result, temperature in zip(requests, results, temperatures, strict=True):
        expected = recomputed_logprobs(policy, req.prompt_token_ids, result.token_ids, temperature)
        torch.testing.assert_close(torch.tensor(result.logprobs), expected, rtol=0, atol=1e-5)


def test_left_padding_leaves_a_greedy_continuation_unchanged(engine: HFGenerator) -> None:
    short = request(4, 1, greedy=True, max_new_tokens=12)
    [alone] = engine.generate([short])
    _, in_batch, _ = engine.generate([request(30, 2, max_new_tokens=5), short, request(19, 3, greedy=True)])
    assert in_batch.token_ids == alone.token_ids
    torch.testing.assert_close(torch.tensor(in_batch.logprobs), torch.tensor(alone.logprobs), rtol=0, atol=1e-5)


def test_generation_stops_on_an_eos_id_or_a_stop_token_and_keeps_it(policy: PreTrainedModel) -> None:
    free = make_engine(policy, eos_token_ids=[NEVER_SAMPLED])
    [reference] = free.generate([request(5, greedy=True, max_new_tokens=8)])
    free.close()
    stop_at = max(i for i, token in enumerate(reference.token_ids) if token not in reference.token_ids[:i])
    stop_token = reference.token_ids[stop_at]  # its first occurrence, after at least one other token
    assert stop_at >= 1

    by_eos = make_engine(policy, eos_token_ids=[NEVER_SAMPLED, stop_token])
    [result] = by_eos.generate([request(5, greedy=True, max_new_tokens=8)])
    by_eos.close()
    assert (result.token_ids, result.finish_reason) == (reference.token_ids[: stop_at + 1], "stop")

    by_request = make_engine(policy, eos_token_ids=[NEVER_SAMPLED])
    [result] = by_request.generate([request(5, greedy=True, max_new_tokens=8, stop_token_ids=(stop_token,))])
    by_request.close()
    assert (result.token_ids, result.finish_reason) == (reference.token_ids[: stop_at + 1], "stop")


def test_max_new_tokens_and_the_context_limit_end_with_finish_reason_length(policy: PreTrainedModel) -> None:
    engine = make_engine(policy, eos_token_ids=[NEVER_SAMPLED], max_context_length=20)
    by_budget, by_context = engine.generate([request(5, max_new_tokens=7), request(17, max_new_tokens=50)])
    too_long = engine.submit(request(20, max_new_tokens=1))
    engine.close()
    assert (len(by_budget.token_ids), by_budget.finish_reason) == (7, "length")
    assert (len(by_context.token_ids), by_context.finish_reason) == (3, "length")  # 17 + 3 = max_context_length
    with pytest.raises(ValueError, match=r"20 tokens.*max_context_length=20"):
        too_long.result()


def test_invalid_prompts_fail_their_future_with_a_value_error(engine: HFGenerator) -> None:
    with pytest.raises(ValueError, match="empty"):
        engine.submit(GenerationRequest((), SamplingParams())).result()
    with pytest.raises(ValueError, match=r"\[300, -1\] are outside the vocabulary \[0, 300\)"):
        engine.submit(GenerationRequest((5, 300, -1), SamplingParams())).result()


def test_concurrent_submitters_are_served_in_shared_batches(policy: PreTrainedModel) -> None:
    engine = make_engine(policy, max_batch_size=6)
    engine.pause()  # the 16 requests queue up while paused, then drain in batches of at most 6
    futures = []
    lock = threading.Lock()

    def submit_four(thread_index: int) -> None:
        for i in range(4):
            future = engine.submit(request(3 + i, thread_index, max_new_tokens=4))
            with lock:
                futures.append(future)

    threads = [threading.Thread(target=submit_four, args=(index,)) for index in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    engine.resume()
    results = [future.result(timeout=30) for future in futures]
    stats = engine.stats()
    engine.close()
    assert len(results) == 16 and all(len(r.token_ids) >= 1 for r in results)
    assert (stats.num_requests, stats.num_batches, stats.largest_batch_size) == (16, 3, 6)


def test_requests_arriving_during_a_batch_are_decoded_together_in_the_next_one(policy: PreTrainedModel) -> None:
    engine = make_engine(policy, eos_token_ids=[NEVER_SAMPLED])
    long_batch = engine.submit(request(5, max_new_tokens=300))  # ~0.3 s of decoding while the others arrive
    barrier = threading.Barrier(8)

    def submit_one(index: int) -> GenerationResult:
        barrier.wait()
        return engine.submit(request(4, index, max_new_tokens=3)).result(timeout=60)

    with ThreadPoolExecutor(max_workers=8) as pool:
        results = list(pool.map(submit_one, range(8)))
    long_batch.result(timeout=60)
    stats = engine.stats()
    engine.close()
    assert all(len(result.token_ids) == 3 for result in results)
    assert stats.num_requests == 9 and stats.largest_batch_size > 1 and stats.num_batches < 9


def test_pause_holds_queued_requests_until_resume(engine: HFGenerator) -> None:
    running = engine.submit(request(5, max_new_tokens=64))
    engine.pause()
    assert not running.running()  # pause returned: the batch it may have started is over
    queued = engine.submit(request(5, max_new_tokens=4))
    with pytest.raises(TimeoutError):
        queued.result(timeout=0.3)
    engine.resume()
    assert len(queued.result(timeout=30).token_ids) == 4


def test_load_weights_gives_the_outputs_of_the_source_model_and_sets_the_version(engine: HFGenerator) -> None:
    source = build_tiny_model(replace(TINY, seed=1))
    greedy = request(9, greedy=True, max_new_tokens=10)
    [before] = engine.generate([greedy])
    engine.load_weights(source.state_dict().items(), version=3)  # state_dict also names the tied lm_head
    [after] = engine.generate([greedy])
    source_engine = make_engine(source)
    [expected] = source_engine.generate([greedy])
    source_engine.close()
    assert engine.policy_version == 3 and (after.policy_version, after.last_policy_version) == (3, 3)
    assert before.logprobs != after.logprobs
    assert after.token_ids == expected.token_ids and after.logprobs == expected.logprobs


def test_load_weights_rejects_missing_extra_and_misshapen_parameters_without_copying(
    engine: HFGenerator, policy: PreTrainedModel
) -> None:
    weights = {name: torch.zeros_like(p) for name, p in policy.named_parameters()}
    before = {name: p.clone() for name, p in policy.named_parameters()}
    missing = {k: v for k, v in weights.items() if k != "model.norm.weight"}
    with pytest.raises(ValueError, match=r"missing parameters \['model.norm.weight'\]"):
        engine.load_weights(missing.items(), version=1)
    with pytest.raises(ValueError, match=r"'model.extra.weight'.*are not parameters"):
        engine.load_weights([*weights.items(), ("model.extra.weight", torch.zeros(2))], version=1)
    misshapen = {**weights, "model.norm.weight": torch.zeros(65)}
    with pytest.raises(ValueError, match=r"model.norm.weight has shape \(65,\), the model's is \(64,\)"):
        engine.load_weights(misshapen.items(), version=1)
    assert engine.policy_version == 0
    assert all(torch.equal(p, before[name]) for name, p in policy.named_parameters())


def test_set_policy_version_tags_later_results(engine: HFGenerator) -> None:
    engine.set_policy_version(7)
    [result] = engine.generate([request(4, max_new_tokens=2)])
    assert (engine.policy_version, result.policy_version, result.last_policy_version) == (7, 7, 7)


def test_an_exception_in_the_decode_fails_its_batch_and_later_requests_are_served(policy: PreTrainedModel) -> None:
    poison = 299

    def raise_on_poison(_module: torch.nn.Module, args: tuple[torch.Tensor, ...]) -> None:
        if bool((args[0] == poison).any()):
            raise RuntimeError("poisoned token in the batch")

    policy.get_input_embeddings().register_forward_pre_hook(raise_on_poison)
    engine = make_engine(policy, eos_token_ids=[NEVER_SAMPLED])
    failed = engine.submit(GenerationRequest((5, poison), SamplingParams(max_new_tokens=3)))
    with pytest.raises(RuntimeError, match="poisoned token"):
        failed.result(timeout=30)
    [later] = engine.generate([GenerationRequest((5, 6), SamplingParams(greedy=True, max_new_tokens=3))])
    stats = engine.stats()
    engine.close()
    assert later.token_ids and poison not in later.token_ids
    assert (stats.num_failed_batches, stats.num_batches) == (1, 1)


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
def test_a_dying_serving_thread_fails_every_waiting_future_instead_of_hanging(
    engine: HFGenerator, monkeypatch: pytest.MonkeyPatch
) -> None:
    def exit_thread(*args: object, **kwargs: object) -> None:
        raise SystemExit("decode thread killed")

    monkeypatch.setattr(hf_generator, "decode_batch", exit_thread)
    engine.pause()
    in_batch = engine.submit(request(4, 0))
    engine.resume()
    with pytest.raises(SystemExit):
        in_batch.result(timeout=30)
    with pytest.raises(GeneratorClosedError):
        engine.submit(request(4, 1)).result(timeout=30)


def test_close_fails_queued_requests_and_rejects_new_ones(engine: HFGenerator) -> None:
    engine.pause()
    queued = [engine.submit(request(4, i)) for i in range(3)]
    engine.close()
    for future in queued:
        with pytest.raises(GeneratorClosedError, match="closed before this request ran"):
            future.result(timeout=5)
    with pytest.raises(GeneratorClosedError):
        engine.submit(request(4)).result(timeout=5)


def test_a_colocated_trainers_training_mode_is_restored_after_a_batch(
    engine: HFGenerator, policy: PreTrainedModel
) -> None:
    policy.train()
    policy.model.layers[0].eval()  # a submodule the trainer froze on purpose keeps its own mode
    engine.generate([request(4, max_new_tokens=3)])
    assert policy.training and policy.model.layers[1].training
    assert not policy.model.layers[0].training
    assert all(p.grad is None for p in policy.parameters())


def test_unsupported_options_are_refused_at_construction(policy: PreTrainedModel) -> None:
    with pytest.raises(NotImplementedError, match="compile=True"):
        make_engine(policy, compile=True)
    with pytest.raises(ValueError, match="model is on cpu, not on device=meta"):
        make_engine(policy, device="meta")
