"""Where a graph-engine decode step spends its time, on the GPU: whole-step replay, its parts, kernel table.

    python3 scripts/profile_decode.py --model /tmp/qwen2.5-0.5b-random --batch 256 --window 768

Prints: ms per replay of the captured step at (batch, window); the same step's pieces timed alone (lm head,
samplers); prefill steps of 1, 8 and N rows x P tokens; one wave of `batch` requests through engine.step()
with the host functions it spent its time in (cProfile); the profiler's top kernels of 5 decode replays.
"""

import argparse
import cProfile
import pstats
import random
import time
from concurrent.futures import Future

import torch
from torch.profiler import ProfilerActivity, profile

from asyncppo.generation.decoder_forward import output_logits
from asyncppo.generation.graph_engine import GraphEngine, GraphEngineSettings
from asyncppo.generation.graph_runner import PrefillChunk
from asyncppo.generation.graph_sampling import sample_tokens
from asyncppo.generation.protocol import GenerationRequest, GenerationResult, SamplingParams
from asyncppo.generation.race_sampling import race_sample_tokens
from asyncppo.models.policy import load_policy


def timed(function, repeats: int = 50) -> float:
    """Median ms of `function` over `repeats` calls, timed with CUDA events after 3 warm-up calls."""
    for _ in range(3):
        function()
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        function()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return sorted(times)[len(times) // 2]


def host_profile(engine: GraphEngine, rows: int, prompt_tokens: int, new_tokens: int) -> None:
    """Wall time of one wave of `rows` requests driven by engine.step(), and the host functions it spends it in."""

    def wave(seed: int) -> float:
        draw = random.Random(seed)
        futures: list[Future[GenerationResult]] = []
        for _ in range(rows):
            prompt = tuple(draw.randrange(32000) for _ in range(prompt_tokens))
            futures.append(Future())
            engine.add(
                GenerationRequest(prompt, SamplingParams(max_new_tokens=new_tokens, ignore_eos=True)), futures[-1]
            )
        torch.cuda.synchronize()
        start = time.perf_counter()
        while engine.has_work:
            engine.step()
        torch.cuda.synchronize()
        return time.perf_counter() - start

    wave(1)
    profiler = cProfile.Profile()
    profiler.enable()
    seconds = wave(2)
    profiler.disable()
    print(
        f"wave of {rows} x ({prompt_tokens} + {new_tokens}) by engine.step(): {seconds:.3f} s, "
        f"{rows * new_tokens / seconds:,.0f} tok/s"
    )
    pstats.Stats(profiler).sort_stats("tottime").print_stats(25)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", required=True)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--window", type=int, default=768)
    parser.add_argument("--prefill-rows", type=int, default=32)
    parser.add_argument("--prefill-tokens", type=int, default=256)
    args = parser.parse_args()
    model = load_policy(args.model, dtype=torch.bfloat16, device="cuda")
    with torch.inference_mode():
        engine = GraphEngine(
            model,
            GraphEngineSettings(max_batch_size=args.batch, max_context_length=args.window, eos_token_ids=(0,), seed=0),
        )
        runner = engine.runner
        rows, window = args.batch, args.window
        seconds = f"compile {runner.compile_seconds:.1f} s, capture {runner.capture_seconds:.1f} s"
        print(f"graphs {len(runner._graphs)}, {seconds}")
        step = timed(lambda: runner._graphs[(rows, window)].replay())
        step_host = timed(lambda: runner.decode(rows, window, False))
        print(f"decode step replay: {step:.3f} ms; with the finished-flag read-back: {step_host:.3f} ms")
        for w in runner.windows:
            print(f"  window {w}: {timed(lambda w=w: runner._graphs[(rows, w)].replay()):.3f} ms")
        for b in runner.settings.decode_buckets:
            print(f"  batch {b} window {window}: {timed(lambda b=b: runner._graphs[(b, window)].replay()):.3f} ms")
        hidden = torch.randn(rows, runner.weights.shape.hidden_size, device="cuda", dtype=torch.bfloat16)
        logits = output_logits(hidden, runner.weights)
        print(f"lm head alone (eager): {timed(lambda: output_logits(hidden, runner.weights)):.3f} ms")
        temperature = torch.ones(rows, device="cuda")
        top_k = torch.zeros(rows, dtype=torch.long, device="cuda")
        seeds = torch.arange(rows, device="cuda")
        greedy = torch.zeros(rows, dtype=torch.bool, device="cuda")
        compiled = torch.compile(sample_tokens, dynamic=True)

        def sampler() -> None:
            compiled(logits, temperature, temperature, top_k, greedy, seeds, seeds, filtered=False)

        print(f"sampler alone (compiled, no graph): {timed(sampler):.3f} ms")

        def race() -> None:
            race_sample_tokens(logits, temperature, greedy, seeds, seeds)

        print(f"race sampler alone (Triton, no graph): {timed(race):.3f} ms")
        tokens, _ = race_sample_tokens(logits, temperature, greedy, seeds, seeds)
        reference, _ = compiled(logits, temperature, temperature, top_k, greedy, seeds, seeds, filtered=False)
        print(f"race vs compiled sampler: {int((tokens == reference).sum())}/{rows} tokens equal")
        for count in (1, 8, args.prefill_rows):
            some = [
                PrefillChunk(slot=i, token_ids=tuple(range(100, 100 + args.prefill_tokens)), start=0, sample=True)
                for i in range(count)
            ]
            print(f"prefill {count} x {args.prefill_tokens}: {timed(lambda s=some: runner.prefill(s), 10):.2f} ms")
        host_profile(engine, rows, args.prefill_tokens, args.window - args.prefill_tokens)
        graph = runner._graphs[(rows, window)]
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(5):
                graph.replay()
            torch.cuda.synchronize()
        print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=25, max_name_column_width=90))


if __name__ == "__main__":
    main()
