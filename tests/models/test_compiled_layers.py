"""Compiled decoder layers compute what the eager ones do, and the packed attention is a well-formed custom op.

On CPU the layers compile with the "aot_eager" backend: it traces the same graphs as inductor (through the custom
op's fake kernels and its registered backward) without generating code, so the checks stay cheap. The `gpu` test
compiles with inductor on CUDA in bf16.
"""

import copy
import itertools
from pathlib import Path

import pytest
import torch
from test_packing import LENGTHS, ragged_batch, relative_error
from test_packing import _qwen_like as qwen_like
from torch._dynamo.utils import counters
from transformers import PreTrainedModel

from asyncppo.config.models import OptimizerConfig, SchedulerConfig
from asyncppo.models.compiled_layers import compile_decoder_layers, compiled_layer_count
from asyncppo.models.policy import load_policy, token_logprobs
from asyncppo.models.varlen_attention import use_packed_attention, varlen_attention
from asyncppo.workers.trained_model import TrainedModelSettings

# A packed batch of other lengths: another token count and another longest sequence than LENGTHS.
OTHER_LENGTHS = [7, 2, 15, 4]


@pytest.fixture(autouse=True)
def fresh_dynamo() -> None:
    """Each test counts the graphs it compiles itself."""
    torch._dynamo.reset()
    counters.clear()


def _packed_inputs(
    lengths: list[int], heads: int, kv_heads: int, size: int, dtype: torch.dtype, device: str = "cpu"
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(query [T, heads, size], key and value [T, kv_heads, size], cu_seq_lens) with random values."""
    generator = torch.Generator().manual_seed(0)
    total = sum(lengths)
    query, key, value = (
        torch.randn(total, h, size, generator=generator, dtype=dtype).to(device) for h in (heads, kv_heads, kv_heads)
    )
    cu = torch.tensor([0, *itertools.accumulate(lengths)], dtype=torch.int32, device=device)
    return query, key, value, cu


def test_the_packed_attention_op_passes_opcheck() -> None:
    # Schema, autograd registration, the fake kernel against the real one, and tracing with dynamic shapes.
    query, key, value, cu = _packed_inputs([3, 1, 5], heads=4, kv_heads=2, size=8, dtype=torch.float64)
    inputs = tuple(x.requires_grad_() for x in (query, key, value))
    torch.library.opcheck(torch.ops.asyncppo.varlen_attention_forward.default, (*inputs, cu, 5, 0.3))
    out, lse = torch.ops.asyncppo.varlen_attention_forward(*inputs, cu, 5, 0.3)
    grad_out = torch.randn_like(out)
    backward_args = (grad_out, *(x.detach() for x in (*inputs, out, lse)), cu, 5, 0.3)
    torch.library.opcheck(torch.ops.asyncppo.varlen_attention_backward.default, backward_args)


def test_the_packed_attention_backward_matches_finite_differences() -> None:
    # The CPU kernel's hand-written backward (varlen_attention's module docstring) against numerical derivatives,
    # in fp64, with grouped-query heads and a one-token sequence.
    query, key, value, cu = _packed_inputs([2, 1, 4], heads=4, kv_heads=2, size=3, dtype=torch.float64)
    inputs = tuple(x.requires_grad_() for x in (query, key, value))
    assert torch.autograd.gradcheck(lambda q, k, v: varlen_attention(q, k, v, cu, 4, 0.7), inputs)


def _compiled_copy(model: PreTrainedModel, **kwargs: str) -> PreTrainedModel:
    compiled = copy.deepcopy(model)
    assert compile_decoder_layers(compiled, **kwargs) == model.config.num_hidden_layers
    return compiled


def _logprobs_and_grads(
    model: PreTrainedModel, ids: torch.Tensor, mask: torch.Tensor, packed: bool
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    model.zero_grad()
    logprobs = token_logprobs(model, ids, mask, temperature=0.7, chunk_size=7, packed=packed)
    (logprobs * torch.linspace(-1, 1, logprobs.numel()).view(logprobs.shape).to(logprobs.device)).sum().backward()
    return logprobs.detach(), {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}


@pytest.mark.slow
def test_compiled_layers_give_the_eager_logprobs_and_gradients_in_one_graph(tiny_dir: Path) -> None:
    eager = load_policy(tiny_dir)
    use_packed_attention(eager)
    compiled = _compiled_copy(eager, backend="aot_eager")
    checkpointed = copy.deepcopy(eager)
    if hasattr(checkpointed, "activation_checkpointing_enable"):  # as TrainedWorker switches it on
        checkpointed.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
    else:
        checkpointed.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    compile_decoder_layers(checkpointed, backend="aot_eager")
    for model in (eager, compiled, checkpointed):
        model.train()  # as in a training pass (checkpointing recomputes only in train mode)
    graphs_after_first_batch = 0
    for lengths in (LENGTHS, OTHER_LENGTHS):
        ids, mask = ragged_batch(lengths, eager.config.vocab_size)
        expected, expected_grads = _logprobs_and_grads(eager, ids, mask, packed=True)
        for model in (compiled, checkpointed):
            actual, actual_grads = _logprobs_and_grads(model, ids, mask, packed=True)
            torch.testing.assert_close(actual, expected, rtol=0, atol=1e-5)
            assert expected_grads.keys() == actual_grads.keys()
            for name, grad in expected_grads.items():
                assert relative_error(actual_grads[name], grad) <= 1e-5, name
        graphs_after_first_batch = graphs_after_first_batch or counters["stats"]["unique_graphs"]
    # Every layer of both models runs one graph (the checkpoint goes around it, so nothing breaks it up), and a
    # batch of another token count and longest sequence reuses it.
    assert graphs_after_first_batch == 1
    assert counters["stats"]["unique_graphs"] == 1


@pytest.mark.slow
def test_a_copy_of_a_compiled_model_runs_its_own_weights_also_padded(tiny_dir: Path) -> None:
    eager = load_policy(tiny_dir)
    original = _compiled_copy(eager, backend="aot_eager")
    copied = copy.deepcopy(original)  # as the policy worker copies its reference
    with torch.no_grad():
        for parameter in copied.model.layers.parameters():
            parameter.mul_(0.5)
    ids, mask = ragged_batch(LENGTHS, original.config.vocab_size)
    expected = token_logprobs(eager, ids, mask, temperature=1.0)  # the padded layout: SDPA with a mask
    before = token_logprobs(original, ids, mask, temperature=1.0)
    changed = token_logprobs(copied, ids, mask, temperature=1.0)
    after = token_logprobs(original, ids, mask, temperature=1.0)
    assert compiled_layer_count(copied) == original.config.num_hidden_layers
    assert counters["stats"]["unique_graphs"] == 1  # the copy's layers run the original's graph
    torch.testing.assert_close(before, expected, rtol=0, atol=1e-5)
    torch.testing.assert_close(after, before, rtol=0, atol=0)
    assert (changed - before).abs().max() > 1e-3


def test_generation_with_a_kv_cache_runs_the_layers_eagerly(tiny_dir: Path) -> None:
    eager = load_policy(tiny_dir)
    compiled = _compiled_copy(eager, backend="aot_eager")
    prompt = torch.tensor([[5, 6, 7, 8]])
    settings = {"max_new_tokens": 4, "do_sample": False, "pad_token_id": 0}
    expected, actual = (
        model.generate(prompt, attention_mask=torch.ones_like(prompt), **settings)  # pyright: ignore[reportCallIssue]
        for model in (eager, compiled)
    )
    assert actual.tolist() == expected.tolist()
    assert counters["stats"]["unique_graphs"] == 0


@pytest.mark.parametrize(
    ("setting", "device", "expected"),
    [("auto", "cuda", True), ("auto", "cpu", False), (True, "cpu", True), (False, "cuda", False)],
)
def test_the_compile_setting_resolves_auto_to_cuda_devices(setting: bool | str, device: str, expected: bool) -> None:
    settings = TrainedModelSettings(
        dtype="float32",
        tokenizer_path=None,
        optimizer=OptimizerConfig(),
        scheduler=SchedulerConfig(),
        scheduler_total_steps=None,
        max_grad_norm=None,
        train_global_batch_size=None,
        train_micro_batch_size=1,
        max_tokens_per_microbatch=None,
        sequence_packing="auto",
        logprob_batch_size=None,
        activation_checkpointing=False,
        compile=setting,  # pyright: ignore[reportArgumentType]
    )
    assert settings.compiles_on(torch.device(device)) is expected


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_inductor_compiled_packed_training_matches_eager_on_cuda_in_bf16() -> None:
    eager = qwen_like("cuda")  # 2 layers of the Qwen2.5-0.5B shape, bf16
    use_packed_attention(eager)
    compiled = _compiled_copy(eager)
    for lengths in ([300, 17, 1024, 5, 640], [900, 33, 250]):
        ids, mask = (x.cuda() for x in ragged_batch(lengths, eager.config.vocab_size))
        expected, expected_grads = _logprobs_and_grads(eager, ids, mask, packed=True)
        actual, actual_grads = _logprobs_and_grads(compiled, ids, mask, packed=True)
        real = mask.bool()
        # bf16 kernels fused differently round differently: compare as probabilities, as the mismatch metric does.
        assert ((actual[real] - expected[real]).exp() - 1).abs().mean() < 1e-2
        for name, grad in expected_grads.items():
            assert relative_error(actual_grads[name].float(), grad.float()) < 5e-2, name
    assert counters["stats"]["unique_graphs"] == 1, "a second token count recompiled"
