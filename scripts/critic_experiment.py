"""Compare critic estimators on the CPU multi-turn gym demo: token GAE, turn_gae, turn_gae + residual baseline,
and the same with a privileged critic that reads the expected answer.

Runs `asyncppo train examples/configs/gym_multi_step.yaml` once per (estimator, seed) with overrides, then prints
a markdown table of the pre-update critic diagnostics and the validation reward (docs/critic.md holds one).

    python scripts/critic_experiment.py --steps 60 --seeds 42 7 --out runs/critic_experiment
    python scripts/critic_experiment.py --summarize-only --out runs/critic_experiment
"""

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

CONFIG = Path(__file__).parents[1] / "examples" / "configs" / "gym_multi_step.yaml"
TOKEN_GAE = [
    "ppo.adv_estimator.name=gae",
    "ppo.adv_estimator.gae_gamma=1.0",
    "ppo.adv_estimator.gae_lambda=1.0",
    "ppo.adv_estimator.gae_lambda_value=null",
    "ppo.adv_estimator.gae_lambda_policy=null",
    "ppo.adv_estimator.length_adaptive_alpha=0.0",
    "ppo.adv_estimator.turn_gae_gamma=null",
    "ppo.adv_estimator.turn_gae_lambda_value=null",
    "ppo.adv_estimator.turn_gae_lambda_policy=null",
    "ppo.adv_estimator.residual_baseline=false",
]
VARIANTS = {
    "token GAE": TOKEN_GAE,
    "turn_gae": ["ppo.adv_estimator.residual_baseline=false"],
    "turn_gae + residual": ["ppo.adv_estimator.residual_baseline=true"],
    # The critic also reads the task's expected answer (the policy never does).
    "turn_gae + residual + privileged": [
        "ppo.adv_estimator.residual_baseline=true",
        "value.privileged_critic.enabled=true",
        "value.privileged_critic.fields=[{name: expected_answer, title: answer}]",
    ],
}
# Pre-update critic diagnostics are averaged over the last steps: single steps are noisy (64 rollouts each).
LAST_STEPS = 20


def run_dir(out: Path, variant: str, seed: int) -> Path:
    return out / f"{variant.replace(' + ', '_').replace(' ', '_')}_seed{seed}"


def run_variant(out: Path, variant: str, seed: int, steps: int) -> None:
    directory = run_dir(out, variant, seed)
    if (directory / "metrics.jsonl").is_file() and _last_step(directory) == steps:
        print(f"{directory}: already complete", flush=True)
        return
    overrides = [
        *VARIANTS[variant],
        f"ppo.seed={seed}",
        f"ppo.max_num_steps={steps}",
        "checkpointing.enabled=false",
        "logger.console=false",
        "logger.tensorboard_enabled=false",
    ]
    command = [sys.executable, "-m", "asyncppo.cli.main", "train", str(CONFIG), "--run-dir", str(directory)]
    print(" ".join(command + overrides), flush=True)
    subprocess.run(command + overrides, check=True)


def _rows(directory: Path) -> list[dict[str, float]]:
    return [json.loads(line) for line in (directory / "metrics.jsonl").read_text().splitlines() if line.strip()]


def _last_step(directory: Path) -> int:
    rows = _rows(directory)
    return int(rows[-1]["step"]) if rows else 0


def summarize(out: Path, seeds: list[int]) -> str:
    """Markdown table: per variant, the mean over seeds (and the per-seed values) of each column."""
    columns = ("critic/explained_var", "critic/ev_res")
    lines = [
        f"| estimator | pre-update `critic/explained_var` (last {LAST_STEPS} steps) "
        f"| `critic/ev_res` (last {LAST_STEPS}) | val reward at start | final val reward |",
        "|---|---|---|---|---|",
    ]
    for variant in VARIANTS:
        cells: dict[str, list[float]] = {name: [] for name in (*columns, "start", "final")}
        for seed in seeds:
            directory = run_dir(out, variant, seed)
            if not (directory / "metrics.jsonl").is_file():
                continue
            rows = _rows(directory)
            trained = [row for row in rows if row["step"] > 0][-LAST_STEPS:]
            for name in columns:
                cells[name].append(statistics.fmean(row[name] for row in trained if name in row))
            validations = [row["val/reward_mean"] for row in rows if "val/reward_mean" in row]
            cells["start"].append(validations[0])
            cells["final"].append(validations[-1])
        if not cells["final"]:
            continue
        lines.append(f"| {variant} | " + " | ".join(_cell(cells[name]) for name in (*columns, "start", "final")) + " |")
    return "\n".join(lines)


def _cell(values: list[float]) -> str:
    per_seed = ", ".join(f"{value:.3f}" for value in values)
    return f"{statistics.fmean(values):.3f} ({per_seed})"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--seeds", type=int, nargs="+", default=[42, 7])
    parser.add_argument("--out", type=Path, default=Path("runs/critic_experiment"))
    parser.add_argument("--summarize-only", action="store_true")
    args = parser.parse_args()
    if not args.summarize_only:
        for seed in args.seeds:
            for variant in VARIANTS:
                run_variant(args.out, variant, seed, args.steps)
    print(summarize(args.out, args.seeds))
    return 0


if __name__ == "__main__":
    sys.exit(main())
