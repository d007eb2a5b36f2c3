"""The trainer's passes alone, one GPU, in-process: ms per pass, MFU, padding and peak memory per setting.

    python scripts/bench_train_pass.py --model /tmp/qwen2.5-0.5b-random [--lengths fixed,longtail] \
        [--settings packed,padded] [--repeats 4]

Builds the real PolicyWorker and ValueWorker (no Ray) and times, per batch and setting, one policy training pass
(forward + backward + fused AdamW over the whole batch, one optimizer step), one critic training pass and one
no-grad logprob scoring pass. Batches: `fixed` = 64 rows of 768 tokens (TRL's PPO workload: 256 prompt + 512
response); `longtail` = 64 prompts x 8 samples, prompt lengths uniform in 64..1024, response lengths lognormal
(median 300, sigma 1.0) capped at 4096. MFU uses `models/flops.py` (model FLOPs of the real tokens) against
--peak-tflops. A setting is a comma-free name from SETTINGS; the median of --repeats passes after one warm-up.
"""

import argparse
import math
import random
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch
from transformers import AutoConfig

from asyncppo.config.losses import PolicyLossConfig, ValueLossConfig
from asyncppo.config.models import OptimizerConfig, SchedulerConfig
from asyncppo.models.flops import DecoderShape, FlopCounter
from asyncppo.types import MessageSpan, TrainBatch
from asyncppo.workers.policy_worker import PolicyWorker, PolicyWorkerSettings
from asyncppo.workers.value_worker import ValueWorker, ValueWorkerSettings

SETTINGS: dict[str, dict[str, Any]] = {
    # one token budget: real tokens when packed, rows x longest row when padded (padded16: the TRL workload's 16 rows)
    "packed": {"sequence_packing": True, "max_tokens_per_microbatch": 16384},
    "packed32k": {"sequence_packing": True, "max_tokens_per_microbatch": 32768},
    "padded": {"sequence_packing": False, "max_tokens_per_microbatch": 16384},
    "padded16": {"sequence_packing": False, "train_micro_batch_size": 16},
    "padded-ckpt": {"sequence_packing": False, "max_tokens_per_microbatch": 16384, "activation_checkpointing": True},
    "packed-ckpt": {"sequence_packing": True, "max_tokens_per_microbatch": 16384, "activation_checkpointing": True},
}


def lengths_of(kind: str, seed: int = 0) -> list[tuple[int, int]]:
    """(prompt, response) token counts per row."""
    if kind == "fixed":
        return [(256, 512)] * 64
    draw = random.Random(seed)
    rows = []
    for _ in range(64):
        prompt = draw.randint(64, 1024)
        rows += [(prompt, min(4096, max(1, round(math.exp(draw.gauss(math.log(300), 1.0)))))) for _ in range(8)]
    return rows


def make_batch(rows: list[tuple[int, int]], vocab_size: int) -> TrainBatch:
    """Right-padded random tokens; advantages +-1 by row, returns 0.5, the loss masks on the responses."""
    generator = torch.Generator().manual_seed(0)
    seq_len = max(p + r for p, r in rows)
    num = len(rows)
    input_ids = torch.randint(1, vocab_size, (num, seq_len), generator=generator)
    attention_mask = torch.zeros(num, seq_len, dtype=torch.long)
    token_mask = torch.zeros(num, seq_len)
    for index, (prompt, response) in enumerate(rows):
        attention_mask[index, : prompt + response] = 1
        token_mask[index, prompt : prompt + response] = 1
    sign = torch.tensor([1.0 if index % 2 else -1.0 for index in range(num)])
    return TrainBatch(
        input_ids=input_ids * attention_mask,
        attention_mask=attention_mask,
        token_mask=token_mask,
        generation_logprobs=torch.zeros(num, seq_len),
        rewards=(sign > 0).float(),
        sample_mask=torch.ones(num),
        group_ids=torch.arange(num),
        prompt_lengths=torch.tensor([p for p, _ in rows]),
        truncated=torch.zeros(num, dtype=torch.bool),
        policy_versions=torch.zeros(num, dtype=torch.long),
        message_logs=tuple((MessageSpan("user", p), MessageSpan("assistant", r)) for p, r in rows),
        advantages=sign[:, None] * token_mask,
        returns=0.5 * token_mask,
    )


def timed(action: Callable[[], object], repeats: int) -> tuple[float, float]:
    """(median seconds, peak GiB) over `repeats` runs after one warm-up."""
    action()
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    times = []
    for _ in range(repeats):
        torch.cuda.synchronize()
        start = time.perf_counter()
        action()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return statistics.median(times), torch.cuda.max_memory_allocated() / 2**30


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--lengths", default="fixed,longtail")
    parser.add_argument("--settings", default="packed,padded")
    parser.add_argument("--repeats", type=int, default=4)
    parser.add_argument("--peak-tflops", type=float, default=989.0)
    parser.add_argument("--passes", default="policy,critic,score")
    parser.add_argument("--profile", action="store_true", help="after timing, profile one run of each pass")
    args = parser.parse_args()
    torch.backends.cuda.enable_cudnn_sdp(False)
    shape = DecoderShape.from_config(AutoConfig.from_pretrained(args.model))
    policy_flops, critic_flops = FlopCounter.for_model(shape, "policy"), FlopCounter.for_model(shape, "critic")
    peak = args.peak_tflops * 1e12
    base = dict(
        dtype="bfloat16",
        tokenizer_path=None,
        optimizer=OptimizerConfig(lr=1e-6),
        scheduler=SchedulerConfig(),
        scheduler_total_steps=None,
        max_grad_norm=1.0,
        train_global_batch_size=None,
        train_micro_batch_size=16,
        max_tokens_per_microbatch=None,
        sequence_packing=True,
        logprob_batch_size=64,
        activation_checkpointing=False,
    )
    print("| batch | setting | pass | ms | MFU | padding | peak GiB |")
    print("|---|---|---|---|---|---|---|")
    for kind in args.lengths.split(","):
        rows = lengths_of(kind)
        batch = make_batch(rows, shape.vocab_size)
        lengths = [p + r for p, r in rows]
        for name in args.settings.split(","):
            common = {**base, **SETTINGS[name]}
            if "policy" in args.passes or "score" in args.passes:
                settings = PolicyWorkerSettings(
                    **common,
                    temperature=1.0,
                    logprob_chunk_size=4096,
                    loss_settings=PolicyLossConfig(use_importance_sampling_correction=True),
                    keep_reference=False,
                )
                worker = PolicyWorker(args.model, "cuda", settings)
                trained = batch.with_fields(old_logprobs=torch.zeros_like(batch.generation_logprobs))
                if "policy" in args.passes:
                    report(
                        kind, name, "policy train", worker.train, trained, policy_flops.training(lengths), peak, args
                    )
                if "score" in args.passes:
                    report(kind, name, "logprobs", worker.logprobs, batch, policy_flops.forward(lengths), peak, args)
                del worker
            if "critic" in args.passes:
                value_settings = ValueWorkerSettings(**common, loss_settings=ValueLossConfig(scale=1.0, cliprange=None))
                critic = ValueWorker(args.model, "cuda", value_settings)
                report(kind, name, "critic train", critic.train, batch, critic_flops.training(lengths), peak, args)
                del critic
            torch.cuda.empty_cache()


def report(
    kind: str,
    name: str,
    label: str,
    action: Callable[[TrainBatch], Any],
    batch: TrainBatch,
    flops: int,
    peak: float,
    args: argparse.Namespace,
) -> None:
    metrics: dict[str, float] = {}

    def run() -> None:
        result = action(batch)
        if isinstance(result, dict):
            metrics.update(result)

    seconds, memory = timed(run, args.repeats)
    computed = next((v for k, v in metrics.items() if k.endswith("/tokens_computed")), float("nan"))
    real = next((v for k, v in metrics.items() if k.endswith("/tokens_real")), float("nan"))
    padding = computed / real if real == real and real else float("nan")
    print(
        f"| {kind} | {name} | {label} | {seconds * 1e3:.0f} | {flops / seconds / peak:.1%} | {padding:.2f} "
        f"| {memory:.1f} |",
        flush=True,
    )
    if args.profile:
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as profiler:
            run()
            torch.cuda.synchronize()
        table = profiler.key_averages().table(sort_by="self_device_time_total", row_limit=25, max_name_column_width=60)
        print(f"profile of {kind} {name} {label}:\n{table}", flush=True)


if __name__ == "__main__":
    main()
