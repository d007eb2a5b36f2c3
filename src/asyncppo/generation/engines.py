"""Choosing and building a generation engine: `hf` (any causal LM, the reference) or `graph` (the fast one).

Called by the workers (colocated and separate generators), `asyncppo gym serve` and `asyncppo bench generate`
with one EngineSettings built from the `generation` config section.

    backend auto  --CUDA and a supported family-->  graph      (else hf, with a warning saying why)
    backend graph --unsupported family-->           error naming `generation.backend: hf`

`prefix_reuse_counters` reads an engine's cumulative prefix-cache counters for the driver's per-step metrics;
`prefix_reuse_metrics` turns two readings into the step's `generation/*` metrics.
"""

import dataclasses
import warnings
from dataclasses import dataclass
from typing import Any, Literal

from transformers import PreTrainedModel

from asyncppo.generation.decoder_weights import UnsupportedModelError, decoder_shape
from asyncppo.generation.graph_generator import GraphGenerator
from asyncppo.generation.graph_settings import GraphEngineSettings
from asyncppo.generation.hf_generator import HFGenerator

Backend = Literal["auto", "hf", "graph"]
Engine = HFGenerator | GraphGenerator
PREFIX_REUSE_COUNTERS = ("prefill_tokens_sent", "prefill_tokens_computed", "prefix_hits")
"""GraphEngineStats fields that show how much prefill the prefix cache saved (cumulative, summable over ranks)."""


@dataclass(frozen=True)
class EngineSettings:
    """How a generation engine is built (plain values from the `generation` config section)."""

    max_batch_size: int
    max_context_length: int
    seed: int
    eos_token_ids: tuple[int, ...]
    pad_token_id: int
    backend: Backend = "auto"
    gpu_memory_utilization: float = 0.6
    kv_cache_tokens: int | None = None
    prefix_cache: bool = True
    recompute_kv_after_weight_update: bool = False


def resolve_backend(model: PreTrainedModel, requested: Backend) -> Literal["hf", "graph"]:
    """The backend `requested` means for `model`: auto picks graph on CUDA when the family is supported."""
    if requested != "auto":
        return requested
    if next(model.parameters()).device.type != "cuda":
        return "hf"
    try:
        decoder_shape(model)
    except UnsupportedModelError as error:
        warnings.warn(f"generation.backend=auto falls back to hf: {error}", stacklevel=2)
        return "hf"
    return "graph"


def build_engine(model: PreTrainedModel, settings: EngineSettings, rank: int = 0) -> Engine:
    """A started engine over `model` (already on its device). Rank r samples from seed + 1000 r, so generator
    ranks never draw the same random numbers for the same prompts."""
    seed = settings.seed + 1000 * rank
    if resolve_backend(model, settings.backend) == "hf":
        return HFGenerator(
            model,
            eos_token_ids=settings.eos_token_ids,
            pad_token_id=settings.pad_token_id,
            max_batch_size=settings.max_batch_size,
            device=next(model.parameters()).device,
            seed=seed,
            max_context_length=settings.max_context_length,
        )
    return GraphGenerator(model, graph_engine_settings(settings, seed))


def graph_engine_settings(settings: EngineSettings, seed: int) -> GraphEngineSettings:
    """The graph engine's settings: every field EngineSettings shares with it by name, the rank's `seed`, and
    the graph engine's own defaults for its scheduler knobs (which EngineSettings does not carry)."""
    shared: dict[str, Any] = {
        field.name: getattr(settings, field.name)
        for field in dataclasses.fields(GraphEngineSettings)
        if hasattr(settings, field.name)
    }
    shared["seed"] = seed
    return GraphEngineSettings(**shared)


def prefix_reuse_counters(engine: Engine | None) -> dict[str, float]:
    """The engine's cumulative PREFIX_REUSE_COUNTERS; {} for an engine without a prefix cache (hf) or none."""
    if not isinstance(engine, GraphGenerator):
        return {}  # hf recomputes every prompt in full: reporting "computed == sent" would be invented
    stats = engine.stats()
    return {name: float(getattr(stats, name)) for name in PREFIX_REUSE_COUNTERS}


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
