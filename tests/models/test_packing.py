"""The packed layout gives the padded layout's numbers: logprobs, values and their gradients, on ragged batches.

The packed forward runs only real tokens, back to back, with attention cut at sequence boundaries; the padded one
runs rows x longest row with a mask. Both must agree to float rounding (fp32 on CPU; bf16 on CUDA under `gpu`).
"""

import itertools
from pathlib import Path

import pytest
import torch
from transformers import PreTrainedModel, Qwen2Config, Qwen2ForCausalLM

from asyncppo.models.packing import pack_rows
from asyncppo.models.policy import load_policy, token_logprobs
from asyncppo.models.value import load_value_model, value_head, values
from asyncppo.models.varlen_attention import PACKED_ATTENTION, use_packed_attention, varlen_attention
from model_shapes import QWEN2_5_0_5B

LENGTHS = [5, 9, 1, 12, 3]  # ragged, with a one-token row (nothing to predict) and the longest in the middle


def ragged_batch(lengths: list[int], vocab_size: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-padded random ids [B, S] (pad id 0) and their attention mask."""
    generator = torch.Generator().manual_seed(seed)
    seq_len = max(lengths) + 2  # trailing all-padding columns too
    ids = torch.randint(1, vocab_size, (len(lengths), seq_len), generator=generator)
    mask = torch.zeros_like(ids)
    for row, length in enumerate(lengths):
        mask[row, :length] = 1
    return ids * mask, mask


def relative_error(actual: torch.Tensor, expected: torch.Tensor) -> float:
    return ((actual - expected).norm() / expected.norm().clamp_min(1e-30)).item()


def test_pack_rows_lays_real_tokens_back_to_back() -> None:
    # Rows of 3, 0 and 2 real tokens in S = 4 columns: flat indices row * 4 + column of each real token.
    mask = torch.tensor([[1, 1, 1, 0], [0, 0, 0, 0], [1, 1, 0, 0]])
    packed = pack_rows(mask)
    assert packed.flat_index.tolist() == [0, 1, 2, 8, 9]
    assert packed.position_ids.tolist() == [0, 1, 2, 0, 1]
    assert packed.cu_seq_lens.tolist() == [0, 3, 5] and packed.cu_seq_lens.dtype == torch.int32
    assert packed.max_length == 3 and packed.num_tokens == 5
    values = torch.arange(12.0).view(3, 4)
    assert packed.gather(values).tolist() == [0.0, 1.0, 2.0, 8.0, 9.0]
    assert packed.scatter(packed.gather(values)).tolist() == [[0, 1, 2, 0], [0, 0, 0, 0], [8, 9, 0, 0]]


def test_varlen_attention_equals_a_block_diagonal_causal_reference() -> None:
    # Each token attends to itself and the earlier tokens of its own sequence only; 4 query heads share 2 kv heads.
    torch.manual_seed(0)
    lengths, heads, kv_heads, size = [3, 1, 5], 4, 2, 8
    total = sum(lengths)
    query = torch.randn(total, heads, size, dtype=torch.float64)
    key, value = torch.randn(2, total, kv_heads, size, dtype=torch.float64)
    cu = torch.tensor([0, *itertools.accumulate(lengths)], dtype=torch.int32)
    out = varlen_attention(query, key, value, cu, max(lengths), scale=0.3)
    sequence = torch.repeat_interleave(torch.arange(len(lengths)), torch.tensor(lengths))
    position = torch.arange(total)
    allowed = (sequence[:, None] == sequence[None, :]) & (position[None, :] <= position[:, None])
    expanded_key, expanded_value = (x.repeat_interleave(heads // kv_heads, dim=1) for x in (key, value))
    scores = torch.einsum("thd,shd->hts", query, expanded_key) * 0.3
    weights = scores.masked_fill(~allowed, float("-inf")).softmax(dim=-1)
    expected = torch.einsum("hts,shd->thd", weights, expanded_value)
    torch.testing.assert_close(out, expected, rtol=0, atol=1e-12)


@pytest.fixture
def policy(tiny_dir: Path) -> PreTrainedModel:
    model = load_policy(tiny_dir)
    use_packed_attention(model)
    return model


def test_switching_attention_leaves_the_padded_forward_unchanged(tiny_dir: Path, policy: PreTrainedModel) -> None:
    ids, mask = ragged_batch(LENGTHS, policy.config.vocab_size)
    with torch.no_grad():
        expected = token_logprobs(load_policy(tiny_dir), ids, mask, temperature=0.7)
        actual = token_logprobs(policy, ids, mask, temperature=0.7)
    assert policy.config._attn_implementation == PACKED_ATTENTION
    torch.testing.assert_close(actual, expected, rtol=0, atol=0)


def test_packed_logprobs_and_gradients_equal_the_padded_ones(policy: PreTrainedModel) -> None:
    ids, mask = ragged_batch(LENGTHS, policy.config.vocab_size)
    weights = torch.randn(ids.shape, generator=torch.Generator().manual_seed(1))
    results = []
    for packed in (False, True):
        policy.zero_grad()
        logprobs = token_logprobs(policy, ids, mask, temperature=0.7, chunk_size=7, packed=packed)
        (logprobs * weights).sum().backward()
        results.append((logprobs.detach(), {name: p.grad.clone() for name, p in policy.named_parameters()}))
    (padded, padded_grads), (packed_, packed_grads) = results
    torch.testing.assert_close(packed_, padded, rtol=0, atol=1e-5)
    assert (packed_[mask == 0] == 0).all() and (packed_[:, 0] == 0).all()
    for name, grad in padded_grads.items():
        assert relative_error(packed_grads[name], grad) <= 1e-5, name


def test_packed_values_and_gradients_equal_the_padded_ones(tiny_dir: Path) -> None:
    model = load_value_model(tiny_dir)
    use_packed_attention(model)
    with torch.no_grad():  # a non-zero head, so the values (and the head's gradient) carry information
        value_head(model).weight.normal_(generator=torch.Generator().manual_seed(2))
    ids, mask = ragged_batch(LENGTHS, model.config.vocab_size, seed=3)
    results = []
    for packed in (False, True):
        model.zero_grad()
        predicted = values(model, ids, mask, packed=packed)
        (predicted**2).sum().backward()
        results.append((predicted.detach(), {name: p.grad.clone() for name, p in model.named_parameters()}))
    (padded, padded_grads), (packed_, packed_grads) = results
    torch.testing.assert_close(packed_, padded, rtol=0, atol=1e-5)
    for name, grad in padded_grads.items():
        if grad.norm() > 0:
            assert relative_error(packed_grads[name], grad) <= 1e-5, name


def test_a_packed_forward_needs_the_switched_attention(tiny_dir: Path) -> None:
    model = load_policy(tiny_dir)
    ids, mask = ragged_batch(LENGTHS, model.config.vocab_size)
    with pytest.raises(ValueError, match="use_packed_attention"):
        token_logprobs(model, ids, mask, temperature=1.0, packed=True)


def test_an_all_padding_batch_packs_to_zeros(policy: PreTrainedModel) -> None:
    ids = torch.zeros(2, 4, dtype=torch.long)
    assert token_logprobs(policy, ids, torch.zeros_like(ids), temperature=1.0, packed=True).abs().sum() == 0


def _qwen_like(device: str) -> PreTrainedModel:
    """A small random Qwen2 (14 query heads over 2 kv heads, head size 64, as Qwen2.5-0.5B) in bf16."""
    shrunk = {"vocab_size": 4096, "intermediate_size": 1024, "num_hidden_layers": 2, "max_position_embeddings": 4096}
    config = Qwen2Config(**(QWEN2_5_0_5B | shrunk))
    torch.manual_seed(0)
    return Qwen2ForCausalLM(config).to(device=device, dtype=torch.bfloat16)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_flash_varlen_matches_the_fp32_reference_on_cuda() -> None:
    torch.manual_seed(0)
    lengths, heads, kv_heads, size = [700, 1, 1500, 33], 14, 2, 64
    cu = torch.tensor([0, *itertools.accumulate(lengths)], dtype=torch.int32, device="cuda")
    inputs = [
        torch.randn(sum(lengths), h, size, device="cuda", dtype=torch.bfloat16) for h in (heads, kv_heads, kv_heads)
    ]
    grad = torch.randn(sum(lengths), heads, size, device="cuda", dtype=torch.bfloat16)
    outputs = []
    for dtype in (torch.bfloat16, torch.float32):
        leaves = [x.detach().to(dtype).requires_grad_(True) for x in inputs]
        query, key, value = leaves if dtype == torch.bfloat16 else [x.cpu() for x in leaves]
        out = varlen_attention(query, key, value, cu if dtype == torch.bfloat16 else cu.cpu(), max(lengths), 0.125)
        out.backward(grad.to(out.device, dtype))
        outputs.append([out.float().cpu()] + [x.grad.float().cpu() for x in leaves])  # pyright: ignore[reportOptionalMemberAccess]
    for name, fast, reference in zip(("out", "dq", "dk", "dv"), *outputs, strict=True):
        assert relative_error(fast, reference) < 2e-2, name


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_packed_and_padded_logprobs_agree_on_cuda_in_bf16() -> None:
    model = _qwen_like("cuda")
    use_packed_attention(model)
    ids, mask = ragged_batch([300, 17, 1024, 5, 640], model.config.vocab_size)
    ids, mask = ids.cuda(), mask.cuda()
    with torch.no_grad():
        padded = token_logprobs(model, ids, mask, temperature=1.0)
        packed = token_logprobs(model, ids, mask, temperature=1.0, packed=True)
    real = mask.bool()
    # Two bf16 kernels (flash varlen vs SDPA) round differently: compare as probabilities, as the mismatch metric does.
    ratio = (packed[real] - padded[real]).exp()
    assert (ratio - 1).abs().mean() < 1e-2, (ratio - 1).abs().mean()
