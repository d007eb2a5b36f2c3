"""The graph engine on a CUDA device, compiled and CUDA-graphed (marker `gpu`): the CPU checks, on the real path.

fp32: greedy tokens identical to the hf engine, logprobs equal a teacher-forced forward. bf16: sampled-token
logprobs against the trainer's own recompute (`token_logprobs`), reduced as the trainer's mismatch metric.
"""

from pathlib import Path

import pytest
import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from asyncppo.algorithms.mismatch import token_mismatch_stats
from asyncppo.generation.graph_generator import GraphGenerator
from asyncppo.generation.graph_settings import GraphEngineSettings
from asyncppo.generation.hf_generator import HFGenerator
from asyncppo.generation.protocol import GenerationRequest, SamplingParams
from asyncppo.models.policy import load_policy, token_logprobs
from asyncppo.models.tiny import EOS_TOKEN_ID, PAD_TOKEN_ID
from model_shapes import QWEN2_5_0_5B

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]


def mixed_prompts(count: int, vocab: int, seed: int) -> list[tuple[int, ...]]:
    draw = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, 200, (count,), generator=draw).tolist()
    return [tuple(torch.randint(3, vocab, (n,), generator=draw).tolist()) for n in lengths]


def test_cuda_graph_engine_is_token_identical_to_hf_in_fp32(tiny_dir: Path) -> None:
    policy = load_policy(tiny_dir, dtype=torch.float32, device="cuda")
    settings = GraphEngineSettings(max_batch_size=16, max_context_length=256, eos_token_ids=(EOS_TOKEN_ID,), seed=0)
    graph = GraphGenerator(policy, settings)
    hf = HFGenerator(policy, [EOS_TOKEN_ID], PAD_TOKEN_ID, 16, "cuda", 0, 256)
    prompts = mixed_prompts(32, 300, seed=1)
    requests = [GenerationRequest(p, SamplingParams(greedy=True, max_new_tokens=40)) for p in prompts]
    expected, got = hf.generate(requests), graph.generate(requests)
    assert graph.stats().num_graphs > 0
    hf.close()
    graph.close()
    assert [r.token_ids for r in got] == [r.token_ids for r in expected]
    for prompt, result in zip(prompts, got, strict=True):
        ids = torch.tensor([prompt + result.token_ids], device="cuda")
        with torch.no_grad():
            reference = token_logprobs(policy, ids, torch.ones_like(ids), 1.0)[0, len(prompt) :]
        torch.testing.assert_close(torch.tensor(result.logprobs, device="cuda"), reference, rtol=0, atol=1e-4)


def test_bf16_sampled_logprobs_agree_with_the_trainer_recompute() -> None:
    torch.manual_seed(0)
    config = Qwen2Config(**QWEN2_5_0_5B, rope_theta=1_000_000.0)
    policy = Qwen2ForCausalLM(config).to(device="cuda", dtype=torch.bfloat16).eval()
    settings = GraphEngineSettings(max_batch_size=64, max_context_length=512, eos_token_ids=(0,), seed=0)
    engine = GraphGenerator(policy, settings)
    prompts = mixed_prompts(64, 32000, seed=2)
    sampling = SamplingParams(temperature=1.0, max_new_tokens=200, ignore_eos=True)
    results = engine.generate([GenerationRequest(p, sampling) for p in prompts])
    engine.close()
    width = max(len(p) + len(r.token_ids) for p, r in zip(prompts, results, strict=True))
    ids = torch.zeros(len(prompts), width, dtype=torch.long, device="cuda")
    mask = torch.zeros_like(ids)
    generated = torch.zeros(len(prompts), width, device="cuda")
    generation_mask = torch.zeros_like(ids)
    for row, (prompt, result) in enumerate(zip(prompts, results, strict=True)):
        full = prompt + result.token_ids
        ids[row, : len(full)] = torch.tensor(full)
        mask[row, : len(full)] = 1
        generated[row, len(prompt) : len(full)] = torch.tensor(result.logprobs)
        generation_mask[row, len(prompt) : len(full)] = 1
    with torch.no_grad():
        recomputed = torch.cat(
            [token_logprobs(policy, ids[i : i + 8], mask[i : i + 8], 1.0) for i in range(0, len(prompts), 8)]
        )
    valid = generation_mask.float()
    stats = token_mismatch_stats(recomputed, generated, valid, float(valid.sum()), "k3")
    error = float(stats["token_mult_prob_error"])
    print(f"bf16 token_mult_prob_error {error:.5f}")
    assert error <= 1.01


@pytest.mark.parametrize(("rows", "dtype"), [(8, torch.bfloat16), (256, torch.bfloat16), (64, torch.float32)])
def test_triton_decode_attention_equals_the_masked_matmul_up_to_each_rows_length(rows: int, dtype: torch.dtype) -> None:
    from asyncppo.generation.decode_attention import split_count, triton_decode_attention
    from asyncppo.generation.decoder_forward import decode_attention

    torch.manual_seed(rows)
    heads, kv_heads, dim, positions = 14, 2, 64, 768
    q = torch.randn(rows, heads, dim, device="cuda", dtype=dtype)
    k_cache = torch.randn(rows + 1, kv_heads, positions, dim, device="cuda", dtype=dtype)
    v_cache = torch.randn_like(k_cache)
    # Lengths as the runner passes them: one column of a wider state matrix (strided).
    state = torch.randint(positions + 1, 10**6, (rows, 9), device="cuda")
    state[:, 2] = torch.randint(1, positions + 1, (rows,), device="cuda")
    state[0, 2], state[-1, 2] = 1, positions  # the edges: one key, every key
    lengths = state[:, 2]
    splits = split_count(rows, kv_heads, positions)
    got = triton_decode_attention(q, k_cache, v_cache, lengths, dim**-0.5, splits)
    mask = torch.arange(positions, device="cuda")[None, :] < lengths[:, None]
    expected = decode_attention(q.double(), k_cache[:rows].double(), v_cache[:rows].double(), mask, dim**-0.5)
    error = (got.double() - expected).norm() / expected.norm()
    # bf16: the probabilities are rounded before the value dot; fp32 must not round to tf32 anywhere.
    assert error < (1e-2 if dtype == torch.bfloat16 else 1e-5), f"relative error {error:.2e}"


def test_the_triton_race_sampler_draws_the_tokens_of_the_reference_sampler() -> None:
    from asyncppo.generation.graph_sampling import sample_tokens
    from asyncppo.generation.race_sampling import race_sample_tokens

    torch.manual_seed(0)
    rows, vocab = 256, 151936
    logits = (torch.randn(rows, vocab, device="cuda") * 4).to(torch.bfloat16)
    temperature = torch.rand(rows, device="cuda") + 0.5
    greedy = torch.arange(rows, device="cuda") % 16 == 0
    seeds = torch.randint(0, 2**62, (rows,), device="cuda")
    unfiltered_k, unfiltered_p = torch.zeros(rows, dtype=torch.long, device="cuda"), torch.ones(rows, device="cuda")
    for position in (0, 1, 12345):
        positions = torch.full((rows,), position, device="cuda")
        tokens, logprobs = race_sample_tokens(logits, temperature, greedy, seeds, positions)
        expected_tokens, expected_logprobs = sample_tokens(
            logits, temperature, unfiltered_p, unfiltered_k, greedy, seeds, positions, filtered=False
        )
        assert torch.equal(tokens, expected_tokens)
        torch.testing.assert_close(logprobs, expected_logprobs, rtol=0, atol=1e-4)


@pytest.mark.parametrize(
    ("heads", "kv_heads", "dim", "dtype"), [(14, 2, 64, torch.bfloat16), (8, 8, 128, torch.float32)]
)
def test_triton_prefill_attention_equals_sdpa_over_each_chunks_slot(
    heads: int, kv_heads: int, dim: int, dtype: torch.dtype
) -> None:
    from types import SimpleNamespace

    from asyncppo.generation.decoder_forward import PrefillBatch, padded_prefill_attention, prefill_mask
    from asyncppo.generation.prefill_attention import block_tokens, query_blocks, triton_prefill_attention

    torch.manual_seed(heads)
    slots, positions = 8, 512
    k_cache = torch.randn(slots + 1, kv_heads, positions, dim, device="cuda", dtype=dtype)
    v_cache = torch.randn_like(k_cache)
    # (slot, start, length): fresh prompts, chunks after a cached prefix or an earlier chunk, single tokens.
    chunks = [(0, 0, 300), (3, 120, 17), (5, 0, 1), (6, 511, 1), (7, 40, 200)]
    real = sum(length for _, _, length in chunks)
    num_tokens = real + 40  # padding tokens, as a captured graph's size would add
    q = torch.randn(num_tokens, heads, dim, device="cuda", dtype=dtype)
    token_positions = [start + i for _, start, length in chunks for i in range(length)] + [0] * (num_tokens - real)
    blocks = query_blocks(
        [c[2] for c in chunks], [c[0] for c in chunks], num_tokens, slots, block_tokens(heads, kv_heads)
    )
    table = torch.tensor(blocks + [(0, 0, 0)] * 7, device="cuda")  # unused grid rows, as in a graph
    got = triton_prefill_attention(q, k_cache, v_cache, torch.tensor(token_positions, device="cuda"), table, dim**-0.5)

    lengths = [length for _, _, length in chunks]
    width, offset = max(lengths), 0
    padded_index = torch.zeros(len(chunks), width, dtype=torch.long)
    packed_index: list[int] = []
    for row, length in enumerate(lengths):
        padded_index[row, :length] = torch.arange(offset, offset + length)
        packed_index.extend(range(row * width, row * width + length))
        offset += length
    # The reference in fp64 on the CPU (SDPA's math kernel; its CUDA kernels take no fp64).
    starts = torch.tensor([c[1] for c in chunks])
    ends = starts + torch.tensor(lengths)
    batch = PrefillBatch(
        token_ids=torch.zeros(0),
        positions=torch.zeros(0),
        token_slots=torch.zeros(0),
        slots=torch.tensor([c[0] for c in chunks]),
        padded_index=padded_index,
        packed_index=torch.tensor(packed_index),
        mask=prefill_mask(starts, ends, width, positions),
        key_length=positions,
    )
    shape = SimpleNamespace(num_heads=heads, num_kv_heads=kv_heads, head_dim=dim)
    cpu = [t.double().cpu() for t in (q, k_cache, v_cache)]
    expected = padded_prefill_attention(*cpu, batch, shape)  # pyright: ignore[reportArgumentType]
    error = (got[:real].double().cpu() - expected[:real]).norm() / expected[:real].norm()
    assert error < (1e-2 if dtype == torch.bfloat16 else 1e-5), f"relative error {error:.2e}"
    assert bool(got[real:].isfinite().all()), "padding tokens must stay finite"
