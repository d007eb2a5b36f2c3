"""Benchmark weight sync: push N MB from rank 0 to receiver processes; print size, buckets, seconds and MB/s.

    .venv/bin/python scripts/bench_weight_sync.py --sizes-mb 1 16 64 256      # gloo between local CPU processes
    python scripts/bench_weight_sync.py --backend nccl --sizes-mb 256 1024    # rank r on cuda:r; needs 2+ GPUs

Each push ends when every receiver has copied every parameter into its own tensors (the receipt), so the
time is end to end. "checksum s" is the same push with the sender's checksum plus one receiver-side checksum.
"""

import argparse
import statistics
import sys
import time

import torch
import torch.multiprocessing as mp

from asyncppo.distributed.process_group import SyncGroupSpec, free_port, open_sync_group
from asyncppo.distributed.weight_sync import WeightReceiver, WeightSender, param_specs, weights_checksum

PARAM_NUMEL = 1 << 22  # 4M elements per parameter, about one large LLM matrix row block


def make_weights(size_mb: float, dtype: torch.dtype, device: torch.device) -> list[tuple[str, torch.Tensor]]:
    total = int(size_mb * 2**20) // dtype.itemsize
    sizes = [PARAM_NUMEL] * (total // PARAM_NUMEL) + ([total % PARAM_NUMEL] if total % PARAM_NUMEL else [])
    return [(f"layer{i}.weight", torch.randn(n, device=device).to(dtype)) for i, n in enumerate(sizes)]


def device_of(backend: str, rank: int) -> torch.device:
    return torch.device("cuda", rank) if backend == "nccl" else torch.device("cpu")


def receiver(rank: int, spec: SyncGroupSpec, args: argparse.Namespace) -> None:
    dtype, device = getattr(torch, args.dtype), device_of(spec.backend, rank)
    with open_sync_group(spec, rank, device) as group:
        version = 0
        for size_mb in args.sizes_mb:
            weights = dict(make_weights(size_mb, dtype, device))
            incoming = WeightReceiver(group, param_specs(weights.items()), int(args.bucket_mb * 2**20))
            for repeat in range(1 + 2 * args.repeats):  # an untimed warm-up push first
                version += 1
                for name, view in incoming.receive(version):
                    weights[name].copy_(view)
                if repeat > args.repeats:
                    weights_checksum(weights.items())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes-mb", type=float, nargs="+", default=[1, 16, 64, 256])
    parser.add_argument("--bucket-mb", type=float, default=64)
    parser.add_argument("--backend", choices=["gloo", "nccl"], default="gloo")
    parser.add_argument("--num-receivers", type=int, default=1)
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--timeout-s", type=float, default=120)
    args = parser.parse_args()
    if args.backend == "nccl" and torch.cuda.device_count() < 1 + args.num_receivers:
        sys.exit(f"nccl needs {1 + args.num_receivers} visible GPUs (one per rank), found {torch.cuda.device_count()}")

    spec = SyncGroupSpec("127.0.0.1", free_port(), 1 + args.num_receivers, args.backend, args.timeout_s)
    context = mp.get_context("spawn")
    processes = [context.Process(target=receiver, args=(rank, spec, args)) for rank in range(1, spec.world_size)]
    for process in processes:
        process.start()
    dtype, device = getattr(torch, args.dtype), device_of(args.backend, 0)
    print(f"backend {args.backend}, {args.num_receivers} receiver(s), {args.dtype}, bucket {args.bucket_mb:g} MB")
    print(f"{'size MB':>9} {'buckets':>8} {'seconds':>9} {'MB/s':>9} {'checksum s':>11}")
    with open_sync_group(spec, 0, device) as group:
        version = 0
        for size_mb in args.sizes_mb:
            weights = make_weights(size_mb, dtype, device)
            sender = WeightSender(group, param_specs(weights), int(args.bucket_mb * 2**20))
            timings: dict[bool, list[float]] = {False: [], True: []}
            for repeat in range(1 + 2 * args.repeats):  # an untimed warm-up push first
                version += 1
                with_checksum = repeat > args.repeats
                started = time.perf_counter()
                report = sender.push(weights, version, compute_checksum=with_checksum)
                if repeat > 0:
                    timings[with_checksum].append(time.perf_counter() - started)
            seconds, checksum_seconds = (statistics.median(timings[flag]) for flag in (False, True))
            megabytes = report.num_bytes / 2**20
            print(
                f"{megabytes:>9.1f} {report.num_buckets:>8} {seconds:>9.4f} {megabytes / seconds:>9.0f} "
                f"{checksum_seconds:>11.4f}"
            )
    for process in processes:
        process.join()


if __name__ == "__main__":
    main()
