"""Print a table of a run's per-step metrics (rewards, critic, mismatch, timings) from its metrics.jsonl.

python scripts/summarize_run.py RUN_DIR [--keys key1,key2,...]
"""

import argparse
import json
import math
from pathlib import Path

DEFAULT_KEYS = (
    "train/reward_mean",
    "val/reward_mean",
    "critic/explained_var",
    "mismatch/token_mult_prob_error",
    "train/response_length_mean",
    "timing/generation",
    "timing/values",
    "timing/logprobs",
    "timing/critic_train",
    "timing/policy_train",
    "timing/weight_sync",
    "timing/step",
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("--keys", default=",".join(DEFAULT_KEYS))
    args = parser.parse_args()
    keys = [key for key in args.keys.split(",") if key]
    records = [json.loads(line) for line in (args.run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    present = [key for key in keys if any(key in record for record in records)]
    print("step  " + "  ".join(f"{key.split('/', 1)[-1][:16]:>16}" for key in present))
    for record in records:
        cells = []
        for key in present:
            value = record.get(key)
            cells.append(f"{value:>16.4f}" if isinstance(value, float) and math.isfinite(value) else f"{'-':>16}")
        print(f"{record['step']:>4}  " + "  ".join(cells))


if __name__ == "__main__":
    main()
