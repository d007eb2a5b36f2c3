"""EngineSettings: how any generation engine is built, the plain values every backend's builder takes.

Built from the `generation` config section by the trainer's setup (and directly by tests); `engines.build_engine`
hands it, with the rank's seed, to the builder its `backend` names. Its own module so that the backend modules,
which `engines.py` imports, can import it too.
"""

from dataclasses import dataclass


@dataclass(frozen=True)
class EngineSettings:
    """How a generation engine is built (plain values from the `generation` config section)."""

    max_batch_size: int
    max_context_length: int
    seed: int
    eos_token_ids: tuple[int, ...]
    pad_token_id: int
    backend: str = "auto"
    """A key of `engines.BACKENDS`, or `auto` (graph on CUDA for a supported family, else hf)."""
    gpu_memory_utilization: float = 0.6
    kv_cache_tokens: int | None = None
    prefix_cache: bool = True
    recompute_kv_after_weight_update: bool = False
    replay_path: str | None = None
    """replay backend: the JSON-lines recording it answers from (see `replay_generator.py`)."""
