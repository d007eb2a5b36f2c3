"""asyncppo on TRL's PPO benchmark workload, one GPU, colocated: seconds per PPO step and where they go.

    python scripts/bench_trl_workload.py --model /tmp/qwen2.5-0.5b-random [--steps 6] [--run-dir DIR] [key=value ...]

The workload of TRL's PPOTrainer benchmark: a random-weight Qwen2.5-0.5B-shaped policy in bf16, 64 prompts of
exactly 256 tokens per step, exactly 512 sampled tokens each (generation.ignore_eos), GAE with a critic, a
reference-policy KL term, 1 PPO epoch, one optimizer step per model per step. Prompts are random digit strings
rendered with the chat template and cut to exactly 256 tokens. The first step (compile, allocations) is
reported apart; the table lists each later step's phases from `metrics.jsonl` and the median.
"""

import argparse
import json
import random
import statistics
import tempfile
from pathlib import Path

from asyncppo.config import load_config
from asyncppo.metrics import read_metrics_jsonl
from asyncppo.models.tokenizer import load_tokenizer
from asyncppo.rollout.single_turn import render_prompt
from asyncppo.trainer.build import build_run
from asyncppo.trainer.loop import train

CONFIG = Path(__file__).parent.parent / "examples" / "configs" / "trl_workload.yaml"


def write_prompts(model: str, path: Path, count: int, length: int) -> None:
    """`count` rows whose chat-rendered prompt is `length` tokens (random digits, trimmed or padded by characters)."""
    tokenizer = load_tokenizer(model)

    def rendered_length(text: str) -> int:
        return len(render_prompt(tokenizer, [{"role": "user", "content": text}])[0])  # as the trainer renders it

    draw = random.Random(0)
    with path.open("w") as rows:
        for _ in range(count):
            digits = "".join(str(draw.randrange(10)) for _ in range(8 * length))
            # The longest prefix of the digits that renders to at most `length` tokens (binary search on characters).
            low, high = 0, len(digits)
            while low < high:
                middle = (low + high + 1) // 2
                low, high = (middle, high) if rendered_length(digits[:middle]) <= length else (low, middle - 1)
            rows.write(json.dumps({"prompt": digits[:low], "answer": "0"}) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True, help="local model directory (scripts/make_random_model.py)")
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--run-dir", type=Path, help="where the run's directory goes (default: a new temporary one)")
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args()
    work = args.run_dir or Path(tempfile.mkdtemp(prefix="trl-workload-"))
    work.mkdir(parents=True, exist_ok=True)
    data = work / "prompts.jsonl"
    write_prompts(args.model, data, count=64 * args.steps, length=256)
    config = load_config(
        str(CONFIG),
        [
            f"model.model_name={args.model}",
            f"data.train_path={data}",
            f"ppo.max_num_steps={args.steps}",
            *args.overrides,
        ],
    )
    run = build_run(config, work / "run")
    try:
        train(run)
    finally:
        run.close()
    steps = read_metrics_jsonl(work / "run" / "metrics.jsonl")
    phases = sorted({key for record in steps for key in record if key.startswith("timing/")})
    print("| step | " + " | ".join(key.removeprefix("timing/") for key in phases) + " |")
    print("|" + "---|" * (len(phases) + 1))
    for record in steps:
        print(f"| {record['step']} | " + " | ".join(f"{record.get(key, 0.0):.2f}" for key in phases) + " |")
    later = [record["timing/step"] for record in steps[1:]]
    mismatch = [record.get("mismatch/token_mult_prob_error", float("nan")) for record in steps]
    print(
        f"\nfirst step {steps[0]['timing/step']:.2f} s; later steps: median {statistics.median(later):.2f} s, "
        f"max {max(later):.2f} s (max / median {max(later) / statistics.median(later):.2f})"
    )
    print(f"mismatch/token_mult_prob_error per step: {', '.join(f'{value:.4f}' for value in mismatch)}")


if __name__ == "__main__":
    main()
