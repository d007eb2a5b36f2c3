"""Choosing and building a generation engine: the registry of backends, each one module with one builder.

Called by the workers (colocated and separate generators), `asyncppo gym serve` and `asyncppo bench generate`
with one EngineSettings built from the `generation` config section; what comes back is only a `Generator`.

    backend auto   --CUDA and a supported family-->  graph      (else hf, with a warning saying why)
    backend graph  --unsupported family-->           error naming `generation.backend: hf`
    backend NAME   --BACKENDS[NAME](model, settings, rank seed)-->  a started engine behind its ServingFront

A new backend is a module with an EngineCore, its ServingFront and a builder (see `replay_generator.py`), plus
its line in BACKENDS. `prefix_reuse_counters` reads an engine's cumulative prefix-cache counters for the
driver's per-step metrics; `prefix_reuse_metrics` turns two readings into the step's `generation/*` metrics.
"""

import warnings
from collections.abc import Callable

from transformers import PreTrainedModel

from asyncppo.generation.decoder_weights import UnsupportedModelError, decoder_shape
from asyncppo.generation.engine_settings import EngineSettings
from asyncppo.generation.graph_generator import build_graph_generator
from asyncppo.generation.hf_generator import build_hf_generator
from asyncppo.generation.protocol import Generator
from asyncppo.generation.replay_generator import build_replay_generator

BACKENDS: dict[str, Callable[[PreTrainedModel, EngineSettings, int], Generator]] = {
    "hf": build_hf_generator,
    "graph": build_graph_generator,
    "replay": build_replay_generator,
}
"""Builder of each backend: (model on its device, settings, the rank's sampling seed) -> a started engine."""
PREFIX_REUSE_COUNTERS = ("prefill_tokens_sent", "prefill_tokens_computed", "prefix_hits")
"""Engine counters that show how much prefill the prefix cache saved (cumulative, summable over ranks)."""


def resolve_backend(model: PreTrainedModel, requested: str) -> str:
    """The backend `requested` means for `model`: auto picks graph on CUDA when the family is supported."""
    if requested != "auto":
        if requested not in BACKENDS:
            raise ValueError(f"generation.backend: {requested!r} is not one of auto, {', '.join(BACKENDS)}")
        return requested
    if next(model.parameters()).device.type != "cuda":
        return "hf"
    try:
        decoder_shape(model)
    except UnsupportedModelError as error:
        warnings.warn(f"generation.backend=auto falls back to hf: {error}", stacklevel=2)
        return "hf"
    return "graph"


def build_engine(model: PreTrainedModel, settings: EngineSettings, rank: int = 0) -> Generator:
    """A started engine over `model` (already on its device). Rank r samples from seed + 1000 r, so generator
    ranks never draw the same random numbers for the same prompts."""
    return BACKENDS[resolve_backend(model, settings.backend)](model, settings, settings.seed + 1000 * rank)


def prefix_reuse_counters(engine: Generator | None) -> dict[str, float]:
    """The engine's cumulative PREFIX_REUSE_COUNTERS; {} for an engine without a prefix cache (hf) or none."""
    counters = {} if engine is None else engine.counters()
    if not all(name in counters for name in PREFIX_REUSE_COUNTERS):
        return {}  # hf recomputes every prompt in full: reporting "computed == sent" would be invented
    return {name: counters[name] for name in PREFIX_REUSE_COUNTERS}


def prefix_reuse_metrics(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    """`generation/*` metrics of the prefill between two readings of summed prefix_reuse_counters.

    {} when `after` has no counters (hf engines). Counters absent from `before` count from 0 (the first
    reading of a run: its engines started at 0). The computed fraction is left out when nothing was sent.
    """
    if not after:
        return {}
    delta = {name: after.get(name, 0.0) - before.get(name, 0.0) for name in PREFIX_REUSE_COUNTERS}
    metrics = {f"generation/{name}": value for name, value in delta.items()}
    if delta["prefill_tokens_sent"] > 0:
        metrics["generation/prefill_computed_fraction"] = (
            delta["prefill_tokens_computed"] / delta["prefill_tokens_sent"]
        )
    return metrics
