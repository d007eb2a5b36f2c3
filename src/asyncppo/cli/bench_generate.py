"""`asyncppo bench generate CONFIG [key=value ...]`: generation alone, one table row per (backend, case).

Called by `cli/main.py`. Loads the config's policy (model.model_name, model.precision, cluster.device) once,
then for each backend and batch size runs a fixed-length case (every request generates exactly
--new-tokens) and, with --variable-new-tokens, a variable-length one (see `generation/benchmark.py`).
Nothing is trained; the rows are printed as a Markdown table as they finish.
"""

import argparse
import dataclasses

from asyncppo.config import ConfigError, load_config


def _int_list(text: str) -> list[int]:
    try:
        values = [int(part) for part in text.split(",") if part]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected comma-separated integers, e.g. 64,256") from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: expected positive integers")
    return values


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("config", help="YAML run config (model, generation and cluster sections are read)")
    parser.add_argument("overrides", nargs="*", metavar="key=value", help="dotted overrides")
    parser.add_argument("--backends", default="graph,hf", help="comma-separated engines to compare (graph,hf)")
    parser.add_argument("--batch-sizes", type=_int_list, default=[64, 256], help="requests per wave, e.g. 64,256")
    parser.add_argument("--prompt-tokens", type=int, default=256, help="prompt length of every request")
    parser.add_argument("--new-tokens", type=int, default=512, help="tokens generated per request (fixed case)")
    parser.add_argument(
        "--variable-new-tokens",
        type=int,
        default=0,
        help="also run the variable case: max_new_tokens drawn from 16..this (0 = skip)",
    )


def run_bench_generate_command(args: argparse.Namespace) -> int:
    # Imported here, not at the top: every `asyncppo` command builds the parser from `add_arguments`, and torch
    # with the engines takes ~7 s of CPU to import (`asyncppo config show` went from ~7 s to under 1 s).
    import torch

    from asyncppo.generation.benchmark import HEADER, BenchCase, copy_bandwidth, format_row, run_case
    from asyncppo.generation.decoder_weights import DecoderWeights, UnsupportedModelError, decoder_shape
    from asyncppo.generation.engines import build_engine
    from asyncppo.models.policy import load_policy
    from asyncppo.trainer.setup import resolve_setup

    config = load_config(args.config, args.overrides)
    backends = [name for name in args.backends.split(",") if name]
    if unknown := [name for name in backends if name not in ("graph", "hf")]:
        raise ConfigError([f"--backends: unknown {unknown}; expected graph and/or hf"])
    setup = resolve_setup(config)
    device = torch.device(setup.device)
    model = load_policy(setup.paths.policy, dtype=setup.dtype, device=device)
    try:
        shape = decoder_shape(model)
    except UnsupportedModelError as error:
        raise ConfigError([f"model.model_name: {error}"]) from None
    dtype_bytes = next(model.parameters()).element_size()
    weight_bytes = DecoderWeights(model, shape, next(model.parameters()).dtype).num_bytes()
    bandwidth = copy_bandwidth(device)
    print(f"model: {setup.paths.policy} ({weight_bytes / 2**30:.2f} GiB of weights read per decode step) on {device}")
    print(f"measured copy bandwidth: {bandwidth / 1e9:,.0f} GB/s\n")
    print(HEADER)
    print("|" + "---|" * (HEADER.count("|") - 1))
    cases = []
    for batch_size in args.batch_sizes:
        for backend in backends:
            cases.append(BenchCase(backend, "fixed", batch_size, args.prompt_tokens, args.new_tokens))
            # The hf engine decodes a wave as one static batch (no refill), so only graph runs the variable case.
            if args.variable_new_tokens and backend == "graph":
                cases.append(BenchCase(backend, "variable", batch_size, args.prompt_tokens, args.variable_new_tokens))
    base = setup.engine
    for case in cases:
        settings = dataclasses.replace(
            base,
            backend=case.backend,
            max_batch_size=case.batch_size,
            max_context_length=case.prompt_tokens + case.new_tokens,
        )
        row = run_case(
            case,
            lambda settings=settings: build_engine(model, settings),
            shape.vocab_size,
            weight_bytes,
            shape.kv_bytes_per_token(dtype_bytes),
            bandwidth,
        )
        print(format_row(row), flush=True)
    return 0
