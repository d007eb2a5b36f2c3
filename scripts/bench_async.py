"""Run the same workload with sync and with async PPO and print steps per second of each and their ratio.

    python scripts/bench_async.py CONFIG [key=value ...] [--steps N] [--max-age A] [--in-flight]

Both runs use separate generator workers (the async placement), no validation and no checkpoints; the rate
is measured over steps 2..N from each step's wall time (`timing/step`: waiting for the batch, training and
the weight sync), so start-up and the first step's warm-up are excluded.
"""

import argparse
import os
import statistics
import tempfile
from pathlib import Path

from asyncppo.config import load_config
from asyncppo.metrics import read_metrics_jsonl
from asyncppo.trainer.build import build_run
from asyncppo.trainer.loop import train


def run_mode(config_path: str, overrides: list[str], run_dir: Path) -> dict[str, float]:
    config = load_config(config_path, overrides)
    run = build_run(config, run_dir)
    try:
        train(run)
    finally:
        run.close()
    steps = read_metrics_jsonl(run_dir / "metrics.jsonl")[1:]
    step_times = [record["timing/step"] for record in steps]
    generation = [record.get("timing/generation", 0.0) for record in steps]
    return {
        "steps_per_s": len(step_times) / sum(step_times),
        "step_s_median": statistics.median(step_times),
        "wait_for_batch_s_median": statistics.median(generation),
        "reward_last": steps[-1]["train/reward_mean"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("config")
    parser.add_argument("overrides", nargs="*")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--max-age", type=int, default=1)
    parser.add_argument("--in-flight", action="store_true", help="in-flight weight updates instead of drain-then-sync")
    args = parser.parse_args()
    common = [
        *args.overrides,
        f"ppo.max_num_steps={args.steps}",
        "ppo.val_period=0",
        "ppo.val_at_start=false",
        "ppo.val_at_end=false",
        "checkpointing.enabled=false",
        "logger.console=false",
        "logger.tensorboard_enabled=false",
        "generation.colocated.enabled=false",
        "loss_fn.use_importance_sampling_correction=true",
    ]
    modes = {
        "sync": ["ppo.async_ppo.enabled=false"],
        "async": [
            "ppo.async_ppo.enabled=true",
            f"ppo.async_ppo.max_trajectory_age_steps={args.max_age}",
            f"ppo.async_ppo.in_flight_weight_updates={str(args.in_flight).lower()}",
        ],
    }
    results = {}
    with tempfile.TemporaryDirectory(prefix="asyncppo-bench-") as scratch:
        for mode, extra in modes.items():
            results[mode] = run_mode(args.config, [*common, *extra], Path(scratch) / mode)
    print(f"\n{'mode':<8}{'steps/s':>10}{'step s (median)':>18}{'batch wait s (median)':>24}{'last reward':>14}")
    for mode, result in results.items():
        print(
            f"{mode:<8}{result['steps_per_s']:>10.3f}{result['step_s_median']:>18.3f}"
            f"{result['wait_for_batch_s_median']:>24.3f}{result['reward_last']:>14.3f}"
        )
    print(f"async / sync steps/s: {results['async']['steps_per_s'] / results['sync']['steps_per_s']:.2f}x")
    print(f"(cache: {os.environ.get('ASYNCPPO_CACHE_DIR', '~/.cache/asyncppo')}, {args.steps} steps each)")


if __name__ == "__main__":
    main()
