"""Generation-only benchmark: drive an engine with synthetic requests and measure it against the memory floor.

Called by `asyncppo bench generate` (`cli/bench_generate.py`). One case = one engine build (its compile and
graph capture timed), one untimed warm-up wave of B requests, then one timed wave:

    fixed     B requests of P random prompt tokens, each generating exactly N tokens (ignore_eos)
    variable  8 B requests, max_new_tokens drawn uniformly from 16..N: continuous batching must refill slots

Why 8 B: once the queue is empty the last B rows drain alone, and with lengths uniform in 16..N that tail
costs about 0.65 N x B idle slot-steps whatever the engine does; over 4 B requests (~2 N B tokens) it would cap
the mean occupancy near 76%, over 8 B near 86%, so the case measures refilling more than the tail.

Figures: tok/s over the wave's wall time (prefill included), steady tok/s and ms per decode step from the
engine's decode counters (graph engine) or wall time over tokens (hf), and the floor of one decode step:
the bytes it must read (weights once + the KV of every live row at the mean context length) over the
measured device copy bandwidth.
"""

import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import torch

from asyncppo.generation.protocol import GenerationRequest, Generator, SamplingParams

CaseKind = Literal["fixed", "variable"]
STEP_COUNTERS = ("decode_steps", "decode_seconds", "decode_rows", "prefill_seconds")
"""Engine counters of its decode and prefill steps (the graph engine keeps them; hf decodes whole batches)."""


@dataclass(frozen=True)
class BenchCase:
    backend: str
    kind: CaseKind
    batch_size: int
    prompt_tokens: int
    new_tokens: int
    """Exactly this many per request (fixed), or the upper end of the drawn range (variable)."""


@dataclass(frozen=True)
class BenchRow:
    case: BenchCase
    num_requests: int
    generated_tokens: int
    wall_seconds: float
    tokens_per_second: float
    """Generated tokens over the wave's wall time, prefill included."""
    steady_tokens_per_second: float
    ms_per_decode_step: float
    floor_ms_per_step: float
    peak_memory_gib: float
    startup_seconds: float
    """Engine build: weight copies, KV allocation, compile and graph capture (graph backend)."""
    mean_decode_rows: float
    prefill_seconds: float
    """Time in prefill steps during the timed wave (graph engine; 0 for hf, which does not split it out)."""


def copy_bandwidth(device: torch.device) -> float:
    """Bytes per second of a large device-to-device copy (read + write counted), median of 5."""
    size = 1 << 28 if device.type == "cuda" else 1 << 26
    source = torch.randn(size // 4, device=device)
    target = torch.empty_like(source)
    timings = []
    for _ in range(6):
        _synchronize(device)
        start = time.perf_counter()
        target.copy_(source)
        _synchronize(device)
        timings.append(time.perf_counter() - start)
    return 2 * size / sorted(timings[1:])[2]


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def case_requests(case: BenchCase, vocab_size: int, seed: int) -> list[GenerationRequest]:
    """The case's synthetic requests (random prompt ids below min(vocab, 32000), fixed or drawn lengths)."""
    draw = random.Random(seed)
    count = case.batch_size if case.kind == "fixed" else 8 * case.batch_size
    requests = []
    for _ in range(count):
        prompt = tuple(draw.randrange(min(vocab_size, 32000)) for _ in range(case.prompt_tokens))
        new = case.new_tokens if case.kind == "fixed" else draw.randint(16, case.new_tokens)
        requests.append(GenerationRequest(prompt, SamplingParams(max_new_tokens=new, ignore_eos=True)))
    return requests


def run_case(
    case: BenchCase,
    build: Callable[[], Generator],
    vocab_size: int,
    weight_bytes: int,
    kv_bytes_per_token: int,
    bandwidth: float,
) -> BenchRow:
    """Build the engine, warm it up with one wave, time a second wave; the engine is closed afterwards."""
    device = torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    start = time.perf_counter()
    engine = build()
    startup = time.perf_counter() - start
    try:
        engine.generate(case_requests(case, vocab_size, seed=1)[: case.batch_size])  # warm-up: one batch
        before = engine.counters()
        prefill_seconds = 0.0
        requests = case_requests(case, vocab_size, seed=2)
        _synchronize(device)
        start = time.perf_counter()
        results = engine.generate(requests)
        _synchronize(device)
        wall = time.perf_counter() - start
        generated = sum(len(result.token_ids) for result in results)
        mean_context = case.prompt_tokens + sum(len(r.token_ids) for r in results) / (2 * len(results))
        if all(name in before for name in STEP_COUNTERS):
            after = engine.counters()
            steps = after["decode_steps"] - before["decode_steps"]
            seconds = after["decode_seconds"] - before["decode_seconds"]
            decode_rows = (after["decode_rows"] - before["decode_rows"]) / max(steps, 1)
            step_ms = 1000 * seconds / max(steps, 1)
            steady = (after["decode_rows"] - before["decode_rows"]) / max(seconds, 1e-9)
            prefill_seconds = after["prefill_seconds"] - before["prefill_seconds"]
        else:  # the hf engine decodes each wave as one batch: every step advances all rows still running
            decode_rows = generated / max(max(len(r.token_ids) for r in results), 1)
            step_ms = 1000 * wall / max(max(len(r.token_ids) for r in results), 1)
            steady = generated / wall
        floor_bytes = weight_bytes + decode_rows * mean_context * kv_bytes_per_token
    finally:
        engine.close()
    peak = torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else 0.0
    return BenchRow(
        case=case,
        num_requests=len(requests),
        generated_tokens=generated,
        wall_seconds=wall,
        tokens_per_second=generated / wall,
        steady_tokens_per_second=steady,
        ms_per_decode_step=step_ms,
        floor_ms_per_step=1000 * floor_bytes / bandwidth,
        peak_memory_gib=peak,
        startup_seconds=startup,
        mean_decode_rows=decode_rows,
        prefill_seconds=prefill_seconds,
    )


HEADER = (
    "| backend | case | batch | prompt | new | tok/s (incl. prefill) | tok/s steady | ms/step | floor ms/step "
    "| x floor | mean rows | prefill s | peak GiB | start-up s |"
)


def format_row(row: BenchRow) -> str:
    case = row.case
    new = f"{case.new_tokens}" if case.kind == "fixed" else f"16..{case.new_tokens}"
    return (
        f"| {case.backend} | {case.kind} | {case.batch_size} | {case.prompt_tokens} | {new} "
        f"| {row.tokens_per_second:,.0f} | {row.steady_tokens_per_second:,.0f} | {row.ms_per_decode_step:.2f} "
        f"| {row.floor_ms_per_step:.2f} | {row.ms_per_decode_step / row.floor_ms_per_step:.1f} "
        f"| {row.mean_decode_rows:.0f} | {row.prefill_seconds:.2f} | {row.peak_memory_gib:.1f} "
        f"| {row.startup_seconds:.1f} |"
    )
