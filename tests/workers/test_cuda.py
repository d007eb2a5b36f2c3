"""The workers on one CUDA device: same numbers as on CPU, fused AdamW, exact save/load, bf16 training runs."""

from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from worker_fakes import make_batch, weights_of, with_old_logprobs

from asyncppo.config.models import OptimizerConfig
from asyncppo.workers.policy_worker import PolicyWorker
from asyncppo.workers.value_worker import ValueWorker

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]

LENGTHS = [8, 12, 10, 6, 12, 7]
# eps = 1 keeps Adam's first update proportional to the gradient, so CPU and GPU agree to rounding.
PROPORTIONAL = OptimizerConfig(lr=0.1, weight_decay=0.0, betas=(0.9, 0.999), eps=1.0)


def test_policy_on_cuda_matches_cpu_and_uses_fused_adamw(make_policy: Callable[..., PolicyWorker]) -> None:
    cpu, cuda = make_policy(optimizer=PROPORTIONAL), make_policy(optimizer=PROPORTIONAL, device="cuda")
    assert cuda.optimizer.defaults["fused"] is True
    batch = with_old_logprobs(cpu, make_batch(LENGTHS))
    scored = cuda.logprobs(batch)
    assert scored.device.type == "cpu" and scored.dtype == torch.float32
    torch.testing.assert_close(scored, batch.old_logprobs, rtol=0, atol=1e-4)
    cpu_metrics, cuda_metrics = cpu.train(batch), cuda.train(batch)
    assert cuda_metrics["policy/loss"] == pytest.approx(cpu_metrics["policy/loss"], abs=1e-4)
    expected = weights_of(cpu.model)
    for name, tensor in weights_of(cuda.model).items():
        torch.testing.assert_close(tensor.cpu(), expected[name], rtol=0, atol=1e-4, msg=name)


def test_value_on_cuda_saves_and_loads_exactly(make_value: Callable[..., ValueWorker], tmp_path: Path) -> None:
    worker = make_value(device="cuda")
    batch = make_batch(LENGTHS)
    batch = batch.with_fields(values=worker.values(batch))
    worker.train(batch)
    saved = weights_of(worker.model)
    worker.save(tmp_path / "value")
    resumed = make_value(device="cuda")
    resumed.load(tmp_path / "value")
    assert all(torch.equal(tensor, saved[name]) for name, tensor in weights_of(resumed.model).items())
    for state, loaded in zip(worker.optimizer.state.values(), resumed.optimizer.state.values(), strict=True):
        assert all(torch.equal(state[key], loaded[key]) for key in ("exp_avg", "exp_avg_sq"))


def test_bf16_policy_trains_and_scores_in_fp32(make_policy: Callable[..., PolicyWorker]) -> None:
    worker = make_policy(device="cuda", dtype="bfloat16", activation_checkpointing=True)
    batch = with_old_logprobs(worker, make_batch(LENGTHS))
    assert batch.old_logprobs is not None and batch.old_logprobs.dtype == torch.float32
    before = weights_of(worker.model)
    metrics = worker.train(batch)
    assert metrics["policy/num_optimizer_steps"] == 1
    assert any(not torch.equal(tensor, before[name]) for name, tensor in weights_of(worker.model).items())
