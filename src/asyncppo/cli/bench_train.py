"""`asyncppo bench train --workload trl|longtail --model MODEL_DIR [options] [key=value ...]`: a short run of a named
workload through the real trainer, then its phases, throughput, MFU, mismatch and memory as Markdown tables.

Called by `cli/main.py`. The workloads, their rows, runs and the numbers read back from metrics.jsonl live in
`trainer/train_bench.py`; this module parses the options and prints. The size options scale a workload down (a
CPU test runs one in seconds); key=value overrides apply to every variant after the bench's own keys.
"""

import argparse
import math
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # torch and the trainer are imported when the command runs, not when the parser is built
    from asyncppo.trainer.train_bench import VariantSummary, WorkloadStats

# The names of trainer/train_bench.py's WORKLOADS (the parser is built without importing the trainer; a test
# checks that the two agree).
WORKLOAD_NAMES = ("trl", "longtail")
PADDED_CHOICES: dict[str, tuple[str, ...]] = {"off": ("packed",), "both": ("packed", "padded"), "only": ("padded",)}
"""--padded -> the variants run, in order."""
MISMATCH_KEY = "mismatch/token_mult_prob_error"


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected a positive integer") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: expected a positive integer")
    return value


def _token_range(text: str) -> tuple[int, int]:
    """`LO..HI` (both included) or `N` (every prompt N tokens)."""
    low, _, high = text.partition("..")
    try:
        bounds = (int(low), int(high or low))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected LO..HI or N, e.g. 64..1024") from None
    if not 1 <= bounds[0] <= bounds[1]:
        raise argparse.ArgumentTypeError(f"{text!r}: expected 1 <= LO <= HI")
    return bounds


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("overrides", nargs="*", metavar="key=value", help="dotted overrides for every variant")
    parser.add_argument("--workload", required=True, choices=WORKLOAD_NAMES, help="named workload (README)")
    parser.add_argument(
        "--model", required=True, metavar="MODEL_DIR", help="policy model directory (scripts/make_random_model.py)"
    )
    parser.add_argument(
        "--steps", type=_positive_int, metavar="N", help="PPO steps per variant (default: the workload's)"
    )
    parser.add_argument(
        "--run-dir", type=Path, metavar="DIR", help="prompts and runs go here (default: a new temporary directory)"
    )
    parser.add_argument(
        "--padded",
        choices=tuple(PADDED_CHOICES),
        default="off",
        help="off: sequence packing only; both: then again padded (model/value.sequence_packing=false); only: padded",
    )
    parser.add_argument(
        "--config", type=Path, metavar="YAML", help="base config (default: examples/configs/<workload>_workload.yaml)"
    )
    scale = parser.add_argument_group("scaling the workload down (CPU tests)")
    scale.add_argument("--num-prompts", type=_positive_int, metavar="N", help="prompts per step")
    scale.add_argument("--samples-per-prompt", type=_positive_int, metavar="G", help="samples per prompt")
    scale.add_argument(
        "--max-response-tokens",
        type=_positive_int,
        metavar="N",
        help="every response's length (trl), or the cap (longtail)",
    )
    scale.add_argument("--prompt-tokens", type=_token_range, metavar="LO..HI", help="prompt length range, e.g. 16..32")


def run_bench_train_command(args: argparse.Namespace) -> int:
    # Imported here, not at the top: every `asyncppo` command builds the parser from `add_arguments`, and the
    # trainer imports torch (~7 s of CPU).
    import dataclasses

    from asyncppo.trainer.train_bench import WORKLOADS, prepare_bench, run_variants, summarize, workload_stats

    workload = WORKLOADS[args.workload]
    sizes = {
        "num_prompts": args.num_prompts,
        "samples_per_prompt": args.samples_per_prompt,
        "max_response_tokens": args.max_response_tokens,
        "min_prompt_tokens": args.prompt_tokens[0] if args.prompt_tokens else None,
        "max_prompt_tokens": args.prompt_tokens[1] if args.prompt_tokens else None,
    }
    workload = dataclasses.replace(workload, **{key: value for key, value in sizes.items() if value is not None})
    steps = args.steps or workload.default_steps
    run_dir = args.run_dir or Path(tempfile.mkdtemp(prefix=f"bench-train-{workload.name}-"))
    variant_names = PADDED_CHOICES[args.padded]
    prepared = prepare_bench(workload, args.model, steps, run_dir, variant_names, args.overrides, args.config)
    print(f"# asyncppo bench train --workload {workload.name}\n")
    print(f"model {args.model}; {steps} steps per variant ({', '.join(variant_names)}); run directory {run_dir}\n")
    print("\n".join(_workload_table(workload_stats(workload, prepared))), flush=True)
    results = run_variants(prepared.variants)
    summaries = [summarize(run) for run in results]
    for variant, summary in zip(prepared.variants, summaries, strict=True):
        print(f"\n## {variant.name}: seconds per phase ({variant.run_dir})\n")
        print("\n".join(_phase_table(summary)))
    print("\n## Summary\n")
    print("\n".join(_summary_table(variant_names, summaries)))
    if len(summaries) == 2:
        packed, padded = summaries
        print(
            f"\npadded / packed step time (median of later steps): {padded.later_step_s / packed.later_step_s:.2f}x "
            f"({padded.later_step_s:.2f} s / {packed.later_step_s:.2f} s)"
        )
    return 0


def _workload_table(stats: "WorkloadStats") -> list[str]:
    tokens = stats.tokens_per_step
    low, median, high = stats.prompt_lengths
    response_median, response_mean, response_max = stats.response_lengths
    return [
        "| prompts per step | samples per prompt | real tokens per step (mean; min..max) | prompt tokens (min / median "
        "/ max) | response tokens (median / mean / max) |",
        "|---|---|---|---|---|",
        f"| {stats.num_prompts} | {stats.samples_per_prompt} | {sum(tokens) / len(tokens):,.0f}; "
        f"{min(tokens):,}..{max(tokens):,} | {low} / {median:g} / {high} | {response_median:g} / "
        f"{response_mean:.1f} / {response_max} |",
    ]


def _phase_table(summary: "VariantSummary") -> list[str]:
    """One row per step: timing/<phase> seconds, then the generation-vs-trainer logprob mismatch."""
    header = ["step", *summary.phases, MISMATCH_KEY]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for record in summary.steps:
        phases = [_number(record.get(f"timing/{phase}"), ".2f") for phase in summary.phases]
        cells = [str(record["step"]), *phases, _number(record.get(MISMATCH_KEY), ".4f")]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def _summary_table(names: Sequence[str], summaries: "Sequence[VariantSummary]") -> list[str]:
    """One column per variant: step times, then perf/* (median of later steps), then memory peaks."""
    rows: list[tuple[str, list[float | None], str]] = [
        ("start-up s", [summary.startup_s for summary in summaries], ".2f"),
        ("first step s", [summary.first_step_s for summary in summaries], ".2f"),
        ("later steps s (median)", [summary.later_step_s for summary in summaries], ".2f"),
    ]
    for key in summaries[0].perf:
        rows.append((f"{key} (median)", [summary.perf[key] for summary in summaries], ".3f"))
    memory_keys = sorted({key for summary in summaries for key in summary.memory})
    for key in memory_keys or ["memory/*_peak_gib"]:
        rows.append((f"{key} (max)", [summary.memory.get(key) for summary in summaries], ".2f"))
    lines = ["| | " + " | ".join(names) + " |", "|---|" + "---|" * len(names)]
    lines += [
        f"| {label} | " + " | ".join(_number(value, spec) for value in values) + " |" for label, values, spec in rows
    ]
    return lines


def _number(value: float | None, spec: str) -> str:
    """`value` formatted by `spec`, or whole and with thousands separated from 100 up (tokens/s); n/a when the run
    did not log it."""
    if value is None:
        return "n/a"
    if math.isfinite(value) and abs(value) >= 100:
        return f"{value:,.0f}"
    return format(value, spec)
