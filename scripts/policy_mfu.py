"""Model FLOPs utilisation (MFU) of the policy's training pass, from a run directory's metrics.

    python scripts/policy_mfu.py RUN_DIR --model MODEL_DIR [--ranks N] [--peak-tflops 989]

Per trained token the policy's update costs 6 N + 12 L H S FLOPs (forward and backward: N parameters, the tied
output head counted once; the attention scores and values of L layers of width H over S positions, the PaLM
paper's convention; activation recomputation not counted, so this is model, not hardware, utilisation). A step
trains `train/num_samples` x `train/sequence_length_mean` tokens x `ppo.ppo_epochs` in `timing/policy_train`
seconds on `--ranks` GPUs of `--peak-tflops` dense bf16 each (989 for an H100/H200 SXM). The first step (compile,
allocations) is left out.
"""

import argparse
import json
import statistics
from pathlib import Path

from transformers import AutoConfig

from asyncppo.metrics import read_metrics_jsonl


def flops_per_token(model_dir: str, sequence_length: float) -> float:
    """6 N + 12 L H S: the training FLOPs of one token (see the module docstring)."""
    config = AutoConfig.from_pretrained(model_dir)
    hidden, layers, vocab = config.hidden_size, config.num_hidden_layers, config.vocab_size
    heads, kv_heads = config.num_attention_heads, config.num_key_value_heads
    head_dim = hidden // heads
    attention = hidden * head_dim * (heads + 2 * kv_heads) + heads * head_dim * hidden
    mlp = 3 * hidden * config.intermediate_size
    tied = getattr(config, "tie_word_embeddings", False)
    parameters = layers * (attention + mlp) + vocab * hidden * (1 if tied else 2)
    return 6 * parameters + 12 * layers * hidden * sequence_length


def policy_mfu(run_dir: Path, model_dir: str, ranks: int, peak_tflops: float, ppo_epochs: int) -> list[float]:
    """MFU of each step after the first, in step order."""
    values = []
    for record in read_metrics_jsonl(run_dir / "metrics.jsonl")[1:]:
        tokens = record["train/num_samples"] * record["train/sequence_length_mean"] * ppo_epochs
        flops = tokens * flops_per_token(model_dir, record["train/sequence_length_mean"])
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
