"""Model FLOPs utilisation (MFU) of the policy's training pass, from a run directory's metrics.

    python scripts/policy_mfu.py RUN_DIR --model MODEL_DIR [--ranks N] [--peak-tflops 989] [--ppo-epochs 1]

Every run logs `perf/policy_train_mfu` per step (exact sequence lengths, the run's own peak: README, Performance
metrics); this script recomputes it for another peak or rank count, and for runs from before `perf/*` existed. The
FLOPs are `asyncppo.models.flops`' (training = 3 x forward, forward = 2 N L + attention over the causal triangle),
with every sample at the step's `train/sequence_length_mean` (the metrics hold only the mean, so the attention term,
quadratic in L, is slightly under-counted for ragged batches). A step trains `train/num_samples` sequences x
`--ppo-epochs` in `timing/policy_train` seconds on `--ranks` GPUs of `--peak-tflops` dense bf16 each (989 for an
H100/H200 SXM). The first step (compile, allocations) is left out.
"""

import argparse
import json
import statistics
from pathlib import Path

from transformers import AutoConfig

from asyncppo.metrics import read_metrics_jsonl
from asyncppo.models.flops import DecoderShape, FlopCounter


def policy_mfu(run_dir: Path, model_dir: str, ranks: int, peak_tflops: float, ppo_epochs: int) -> list[float]:
    """MFU of each step after the first, in step order."""
    counter = FlopCounter.for_model(DecoderShape.from_config(AutoConfig.from_pretrained(model_dir)), "policy")
    values = []
    for record in read_metrics_jsonl(run_dir / "metrics.jsonl")[1:]:
        lengths = [round(record["train/sequence_length_mean"])] * int(record["train/num_samples"])
        flops = ppo_epochs * counter.training(lengths)
        values.append(flops / (record["timing/policy_train"] * ranks * peak_tflops * 1e12))
    return values


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("--model", required=True)
    parser.add_argument("--ranks", type=int, default=1)
    parser.add_argument("--peak-tflops", type=float, default=989.0)
    parser.add_argument("--ppo-epochs", type=int, default=1)
    args = parser.parse_args()
    values = policy_mfu(args.run_dir, args.model, args.ranks, args.peak_tflops, args.ppo_epochs)
    summary = {"median": statistics.median(values), "max": max(values), "steps": len(values), "ranks": args.ranks}
    print(f"policy MFU: median {summary['median']:.1%}, max {summary['max']:.1%} over {len(values)} steps")
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
