"""Two ranks with FSDP2 give what one process gives: scores, updates, metrics, save/load, exported weights.

On CPU (gloo) always; on two GPUs (NCCL) under the `gpu` marker. The ranks get unequal micro-batch counts
(token budget) and, in the remainder global batch, one rank has no row at all, so the loss-free padding
micro-batches and the sum-reduced gradients are both exercised. The ranks pack their sequences; on CPU the single
process also runs the padded layout: packing, sharding and a different micro-batch cut change nothing.
"""

from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from worker_fakes import make_batch, policy_settings, value_settings, with_old_logprobs

from asyncppo.config.losses import ValueLossConfig
from asyncppo.config.models import OptimizerConfig
from asyncppo.workers.policy_worker import PolicyWorker
from asyncppo.workers.value_worker import ValueWorker

LENGTHS = [8, 12, 10, 6, 12]  # global batches of 4: rows 0-3, then row 4 alone (rank 1 gets nothing)
WORLD_SIZE = 2


def build_workers(model_dir: Path, device: str, packed: bool = True) -> tuple[PolicyWorker, ValueWorker]:
    # eps = 1: Adam's update stays proportional to the gradient, so summation-order noise is not amplified into
    # sign flips on near-zero gradients (as eps = 1e-8 would do over several steps).
    shared: dict[str, Any] = {
        "train_global_batch_size": 4,
        "max_tokens_per_microbatch": 20,
        "logprob_batch_size": 2,
        "sequence_packing": packed,
        "optimizer": OptimizerConfig(lr=0.1, weight_decay=0.0, betas=(0.9, 0.999), eps=1.0),
    }
    policy = PolicyWorker(model_dir, device, policy_settings(**shared, keep_reference=True))
    value = ValueWorker(
        model_dir, device, value_settings(**shared, loss_settings=ValueLossConfig(scale=1.0, cliprange=0.5))
    )
    return policy, value


def run_steps(model_dir: Path, checkpoint_dir: Path, device: str, packed: bool = True) -> dict[str, Any]:
    """Score, train, save, load, train again; everything a rank or the single process reports (on CPU)."""
    policy, value = build_workers(model_dir, device, packed)
    batch = with_old_logprobs(policy, make_batch(LENGTHS))
    batch = batch.with_fields(values=value.values(batch), reference_logprobs=policy.reference_logprobs(batch))
    offsets = (torch.linspace(0.0, 1.0, len(LENGTHS)), torch.zeros(len(LENGTHS)))
    result: dict[str, Any] = {"old_logprobs": batch.old_logprobs, "values": batch.values}
    result["policy_metrics"] = policy.train(batch)
    result["critic_metrics"] = value.train(batch, offsets=offsets)
    result["critic_eval"] = value.evaluate(batch, offsets=offsets)
    policy.save(checkpoint_dir)
    policy.load(checkpoint_dir)
    result["policy_metrics_after_load"] = policy.train(batch)
    result["weights"] = {name: tensor.cpu().clone() for name, tensor in policy.named_weights()}
    result["logprobs"] = policy.logprobs(batch)
    # One global batch (4 rows), old logprobs from the pass's own forwards, gathered from both ranks.
    on_policy = batch.select([0, 1, 2, 3]).with_fields(old_logprobs=None)
    result["on_policy_metrics"], result["on_policy_logprobs"] = policy.train_on_policy(on_policy)
    return result


def rank_main(rank: int, model_dir: Path, output_dir: Path, backend: str) -> None:
    torch.set_num_threads(1)
    device = "cpu"
    if backend == "nccl":
        device = f"cuda:{rank}"
        torch.cuda.set_device(rank)
    # A file rendezvous: no port to race for with other test runs on the machine.
    init_method = f"file://{output_dir / 'rendezvous'}"
    dist.init_process_group(backend, init_method=init_method, rank=rank, world_size=WORLD_SIZE)
    try:
        result = run_steps(model_dir, output_dir / "checkpoint", device)
        if rank == 0:
            torch.save(result, output_dir / "rank0.pt")
    finally:
        dist.destroy_process_group()


def check_two_ranks_match_one_process(
    model_dir: Path, output_dir: Path, backend: str, tolerance: float, single_packed: bool = True
) -> None:
    mp.spawn(rank_main, args=(model_dir, output_dir, backend), nprocs=WORLD_SIZE)
    sharded = torch.load(output_dir / "rank0.pt", weights_only=True)
    single = run_steps(model_dir, output_dir / "single", "cuda:0" if backend == "nccl" else "cpu", single_packed)

    for key in ("old_logprobs", "values", "logprobs", "on_policy_logprobs"):
        torch.testing.assert_close(sharded[key], single[key], rtol=0, atol=tolerance, msg=key)
    for key in ("policy_metrics", "critic_metrics", "critic_eval", "policy_metrics_after_load", "on_policy_metrics"):
        assert sharded[key].keys() == single[key].keys()
        for name, value in single[key].items():
            if name.endswith("tokens_computed") and not single_packed:
                continue  # padding is what the packed ranks do not compute
            assert sharded[key][name] == pytest.approx(value, rel=10 * tolerance, abs=tolerance), f"{key}: {name}"
    assert single["policy_metrics"]["policy/num_optimizer_steps"] == 2
    assert sharded["weights"].keys() == single["weights"].keys()
    for name, tensor in single["weights"].items():
        torch.testing.assert_close(sharded["weights"][name], tensor, rtol=0, atol=tolerance, msg=name)
    # The sharded checkpoint is an ordinary one: a single process loads it.
    policy, _ = build_workers(model_dir, "cpu")
    policy.load(output_dir / "checkpoint")


@pytest.mark.slow
def test_two_packed_fsdp_ranks_on_cpu_match_one_padded_process(tiny_dir: Path, tmp_path: Path) -> None:
    check_two_ranks_match_one_process(tiny_dir, tmp_path, "gloo", tolerance=1e-5, single_packed=False)


@pytest.mark.gpu
@pytest.mark.skipif(torch.cuda.device_count() < WORLD_SIZE, reason="needs two CUDA devices")
def test_two_fsdp_ranks_on_gpus_match_one_gpu(tiny_dir: Path, tmp_path: Path) -> None:
    # GPU kernels pick different algorithms for different micro-batch shapes, so agreement is looser than on CPU.
    check_two_ranks_match_one_process(tiny_dir, tmp_path, "nccl", tolerance=1e-4)
