"""Named training workloads of `asyncppo bench train`: their rows, their configs, their runs, and the numbers read
back from each run's metrics.jsonl. `cli/bench_train.py` calls `prepare_bench`, `workload_stats`, `run_variants`
and `summarize`, in that order, and prints what they return.

    WORKLOADS[name] --scaled by the options--> Workload --draw_rows (seeded)--> prompt and response lengths
        --write_prompts (chat-rendered to length)--> RUN_DIR/prompts.jsonl (response budgets under
                                                     data.max_new_tokens_key, one per sample)
    examples/configs/<name>_workload.yaml + bench overrides + key=value --load_config--> one RunConfig per variant
        --build_run, train (one variant after the other)--> RUN_DIR/<variant>/metrics.jsonl --summarize--> tables

Variants: `packed` switches sequence packing on for both trained models, `padded` off, so the two step times
compare the same rows with and without padding.
"""

import json
import math
import random
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import ray
from transformers import PreTrainedTokenizerBase

from asyncppo.config import ConfigError, RunConfig, load_config
from asyncppo.metrics import read_metrics_jsonl
from asyncppo.metrics.report_sections import MFU_KEYS
from asyncppo.rollout.single_turn import render_prompt
from asyncppo.trainer.build import build_run
from asyncppo.trainer.loop import train
from asyncppo.trainer.setup import resolve_setup
from asyncppo.workers.ray_cluster import shutdown_ray

REPO_ROOT = Path(__file__).resolve().parents[3]
"""The source checkout the workloads' base configs ship in (examples/configs/)."""
SEED = 0
"""Seed of the drawn lengths and of the prompts' digits: every run of a workload at the same sizes trains on the
same rows (and `trl` on the rows scripts wrote before this command existed)."""
PROMPTS_FILE = "prompts.jsonl"


@dataclass(frozen=True)
class Workload:
    """What one PPO step trains on; the bench's size options scale it down (CPU tests) without changing its kind."""

    name: str
    config_file: str
    """Base config, relative to the repository root."""
    num_prompts: int
    samples_per_prompt: int
    min_prompt_tokens: int
    max_prompt_tokens: int
    """Each prompt's chat-rendered length is drawn uniformly from min..max (both included)."""
    max_response_tokens: int
    """Every response's length when response_median is None, else the cap of the drawn lengths."""
    response_median: float | None = None
    """Median of the lognormal response lengths; None = every response is max_response_tokens long."""
    response_sigma: float = 0.0
    """Standard deviation of the natural log of the response lengths."""
    default_steps: int = 6

    @property
    def max_sequence_tokens(self) -> int:
        """The longest prompt + response: the trained models' max_total_sequence_length."""
        return self.max_prompt_tokens + self.max_response_tokens


WORKLOADS: dict[str, Workload] = {
    # TRL's PPOTrainer benchmark: 64 prompts x (256 prompt + exactly 512 sampled tokens), 1 sample each.
    "trl": Workload("trl", "examples/configs/trl_workload.yaml", 64, 1, 256, 256, 512),
    # Group sampling with a long tail: most responses short, a few 10x the median, capped at 4096.
    "longtail": Workload(
        "longtail",
        "examples/configs/longtail_workload.yaml",
        num_prompts=64,
        samples_per_prompt=8,
        min_prompt_tokens=64,
        max_prompt_tokens=1024,
        max_response_tokens=4096,
        response_median=300.0,
        response_sigma=1.0,
        default_steps=4,
    ),
}
VARIANT_OVERRIDES: dict[str, tuple[str, ...]] = {
    "packed": ("model.sequence_packing=true", "value.sequence_packing=true"),
    "padded": ("model.sequence_packing=false", "value.sequence_packing=false"),
}
"""Each variant's overrides, applied after the user's; its run directory is RUN_DIR/<variant>. Both are explicit,
so the two differ on CPU too (where `auto` keeps the padded layout)."""


@dataclass(frozen=True)
class DrawnRow:
    """The lengths of one prompt row."""

    prompt_tokens: int
    response_tokens: tuple[int, ...]
    """One per sample."""


def draw_rows(workload: Workload, num_rows: int, seed: int = SEED) -> list[DrawnRow]:
    """`num_rows` rows of lengths, row after row from one seeded generator: the first k rows do not depend on
    num_rows. Response length = round(exp(N(ln median, sigma^2))) clipped to 1..max_response_tokens."""
    draw = random.Random(seed)
    rows: list[DrawnRow] = []
    for _ in range(num_rows):
        prompt = draw.randint(workload.min_prompt_tokens, workload.max_prompt_tokens)
        responses = tuple(_response_length(workload, draw) for _ in range(workload.samples_per_prompt))
        rows.append(DrawnRow(prompt, responses))
    return rows


def _response_length(workload: Workload, draw: random.Random) -> int:
    if workload.response_median is None:
        return workload.max_response_tokens
    drawn = draw.lognormvariate(math.log(workload.response_median), workload.response_sigma)
    return max(1, min(workload.max_response_tokens, round(drawn)))


def write_prompts(
    tokenizer: PreTrainedTokenizerBase, rows: Sequence[DrawnRow], path: Path, budget_key: str | None
) -> list[int]:
    """One JSONL row per drawn row: random digits whose chat-rendered prompt is the drawn length (the longest digit
    prefix that renders to at most it), answer "0", and under `budget_key` (when set) the response lengths.

    Returns each prompt's rendered length. A drawn length below the chat template's own tokens is a ConfigError.
    """

    def rendered_length(text: str) -> int:
        return len(render_prompt(tokenizer, [{"role": "user", "content": text}])[0])  # as the trainer renders it

    floor = rendered_length("")
    if (shortest := min((row.prompt_tokens for row in rows), default=floor)) <= floor:
        raise ConfigError(
            [f"--prompt-tokens: {shortest} leaves no room for a prompt: the chat template alone is {floor} tokens"]
        )
    digits_draw = random.Random(SEED)
    lengths: list[int] = []
    with path.open("w") as file:
        for row in rows:
            length = row.prompt_tokens
            digits = "".join(str(digits_draw.randrange(10)) for _ in range(8 * length))
            # The longest prefix of the digits that renders to at most `length` tokens (binary search on characters).
            low, high = 0, len(digits)
            while low < high:
                middle = (low + high + 1) // 2
                low, high = (middle, high) if rendered_length(digits[:middle]) <= length else (low, middle - 1)
            record: dict[str, Any] = {"prompt": digits[:low], "answer": "0"}
            if budget_key is not None:
                record[budget_key] = list(row.response_tokens)
            file.write(json.dumps(record) + "\n")
            lengths.append(rendered_length(digits[:low]))
    return lengths


@dataclass(frozen=True)
class Variant:
    """One run of the bench: `name` (a VARIANT_OVERRIDES key), its config (validated when the bench is prepared,
    before any run starts) and its run directory."""

    name: str
    config: RunConfig
    run_dir: Path

    @property
    def metrics_path(self) -> Path:
        return self.run_dir / "metrics.jsonl"


@dataclass(frozen=True)
class PreparedBench:
    """The variants to run, and the rows they all train on (drawn, and as the prompts were rendered)."""

    variants: list[Variant]
    rows: list[DrawnRow]
    prompt_lengths: list[int]


def bench_overrides(workload: Workload, model: str, data_path: Path, steps: int) -> list[str]:
    """The keys the bench sets from the workload, before the user's key=value overrides."""
    step_batch = workload.num_prompts * workload.samples_per_prompt
    return [
        f"model.model_name={model}",
        f"data.train_path={data_path}",
        f"ppo.max_num_steps={steps}",
        f"ppo.num_prompts_per_step={workload.num_prompts}",
        f"ppo.num_generations_per_prompt={workload.samples_per_prompt}",
        # One optimizer step per model per PPO step, at any scale.
        f"model.train_global_batch_size={step_batch}",
        f"value.train_global_batch_size={step_batch}",
        f"generation.max_new_tokens={workload.max_response_tokens}",
        f"model.max_total_sequence_length={workload.max_sequence_tokens}",
        f"value.max_total_sequence_length={workload.max_sequence_tokens}",
    ]


def prepare_bench(
    workload: Workload,
    model: str,
    steps: int,
    run_dir: Path,
    variant_names: Sequence[str],
    overrides: Sequence[str] = (),
    config_file: Path | None = None,
) -> PreparedBench:
    """Validate every variant's config (a mistake costs nothing: no row is written, no run started), then draw the
    rows and write RUN_DIR/prompts.jsonl."""
    config_path = config_file or REPO_ROOT / workload.config_file
    if not config_path.is_file():
        raise ConfigError([f"--config: {config_path} does not exist; pass --config or run from a source checkout"])
    data_path = run_dir.resolve() / PROMPTS_FILE
    base = [*bench_overrides(workload, model, data_path, steps), *overrides]
    variants = [
        Variant(name, load_config(config_path, [*base, *VARIANT_OVERRIDES[name]]), run_dir / name)
        for name in variant_names
    ]
    config = variants[0].config
    budget_key = config.data.max_new_tokens_key
    if workload.response_median is not None and budget_key is None:
        raise ConfigError(
            [
                f"data.max_new_tokens_key: the {workload.name} workload sets each response's length through it "
                "(its config names the field); keep it set"
            ]
        )
    rows = draw_rows(workload, workload.num_prompts * steps)
    run_dir.mkdir(parents=True, exist_ok=True)
    # The data file is written next, from the tokenizer: the runs' pre-flight checks it when they start.
    prompt_lengths = write_prompts(resolve_setup(config).tokenizer, rows, data_path, budget_key)
    return PreparedBench(variants, rows, prompt_lengths)


@dataclass(frozen=True)
class WorkloadStats:
    """The workload's own numbers, from the rows (not from the runs)."""

    num_prompts: int
    samples_per_prompt: int
    tokens_per_step: list[int]
    """Prompt + response tokens of every sample, per step: what a padding-free step computes on."""
    prompt_lengths: tuple[int, float, int]
    """Rendered prompt tokens: min, median, max."""
    response_lengths: tuple[float, float, int]
    """Response tokens of every sample: median, mean, max."""


def workload_stats(workload: Workload, prepared: PreparedBench) -> WorkloadStats:
    """Stats of the rows, step by step as the runs draw them (in file order: the configs do not shuffle)."""
    samples = workload.samples_per_prompt
    per_row = [
        prompt * samples + sum(row.response_tokens)
        for row, prompt in zip(prepared.rows, prepared.prompt_lengths, strict=True)
    ]
    size = workload.num_prompts
    responses = [length for row in prepared.rows for length in row.response_tokens]
    prompts = prepared.prompt_lengths
    return WorkloadStats(
        num_prompts=workload.num_prompts,
        samples_per_prompt=samples,
        tokens_per_step=[sum(per_row[start : start + size]) for start in range(0, len(per_row), size)],
        prompt_lengths=(min(prompts), statistics.median(prompts), max(prompts)),
        response_lengths=(statistics.median(responses), statistics.fmean(responses), max(responses)),
    )


@dataclass(frozen=True)
class VariantRun:
    """One variant's metrics.jsonl records and its start-up seconds (build_run: Ray for the first variant, the
    workers' model loads, the generators' engine compile and capture, the trainers' layer compile)."""

    records: list[dict[str, Any]]
    startup_s: float


def run_variants(variants: Sequence[Variant]) -> list[VariantRun]:
    """Train each variant in turn (build_run + train, as `asyncppo train` does minus its signal handling). Ray is
    shut down at the end only when this call started it."""
    ray_was_up = ray.is_initialized()
    startups: list[float] = []
    try:
        for variant in variants:
            started = time.perf_counter()
            run = build_run(variant.config, variant.run_dir)
            startups.append(time.perf_counter() - started)
            trained = False
            try:
                train(run)
                trained = True
            finally:
                run.close(keep_workers=trained)
    finally:
        if not ray_was_up:
            shutdown_ray()
    return [
        VariantRun(read_metrics_jsonl(variant.metrics_path), startup_s)
        for variant, startup_s in zip(variants, startups, strict=True)
    ]


PHASE_ORDER = (
    "generation",
    "values",
    "logprobs",
    "reference_logprobs",
    "critic_train",
    "policy_train",
    "weight_sync",
    "sync_bubble",
    "validation",
)
"""timing/<phase> columns in the order a step runs them; phases not listed follow, by name, then `step`."""
PERF_KEYS = ("perf/trained_tokens_per_s", "perf/padding_ratio", *MFU_KEYS)


@dataclass(frozen=True)
class VariantSummary:
    """What the bench prints of one run. `later` = the steps after the first (compile, allocations), or the only
    step of a one-step run."""

    steps: list[dict[str, Any]]
    """The records of the training steps, in order."""
    phases: list[str]
    """Phase names (timing/<name>) logged by any step, in PHASE_ORDER, `step` last."""
    startup_s: float
    """build_run's seconds (`VariantRun.startup_s`)."""
    first_step_s: float
    later_step_s: float
    """Median timing/step of the later steps."""
    perf: dict[str, float | None]
    """PERF_KEYS -> median over the later steps; None when the run does not log the key."""
    memory: dict[str, float]
    """memory/*_peak_gib -> the largest value of any step."""


def summarize(run: VariantRun) -> VariantSummary:
    """The summary of one run (validation-only records are skipped)."""
    records = run.records
    steps = [record for record in records if "timing/step" in record]
    if not steps:
        raise ValueError("the run logged no training step (no record holds timing/step)")
    later = steps[1:] or steps
    logged = {key.removeprefix("timing/") for record in steps for key in record if key.startswith("timing/")}
    known = [phase for phase in PHASE_ORDER if phase in logged]
    others = sorted(logged - set(PHASE_ORDER) - {"step"})
    memory_keys = sorted(
        {key for record in steps for key in record if key.startswith("memory/") and key.endswith("_peak_gib")}
    )
    return VariantSummary(
        steps=list(steps),
        phases=[*known, *others, "step"],
        startup_s=run.startup_s,
        first_step_s=float(steps[0]["timing/step"]),
        later_step_s=statistics.median(float(record["timing/step"]) for record in later),
        perf={key: _median_of(later, key) for key in PERF_KEYS},
        memory={key: max(float(record.get(key, 0.0)) for record in steps) for key in memory_keys},
    )


def _median_of(records: Sequence[dict[str, Any]], key: str) -> float | None:
    values = [float(record[key]) for record in records if key in record]
    return statistics.median(values) if values else None
