"""GraphEngineSettings, and the runner sizes they come to on a device: KV slots, decode buckets, kernels.

`GraphEngine` (`generation/graph_engine.py`) calls `runner_settings` once at start; `engines.py` builds the
settings from the `generation` config section.

    settings --max_context_length--> positions per slot (x16)      --max_batch_size--> decode buckets
             --KV bytes per token, kv_cache_tokens or gpu_memory_utilization--> KV slots (ValueError if too few)
             --device, head dim--> CUDA graphs, compile, Triton kernels, prefill buckets
"""

from dataclasses import dataclass

import torch

from asyncppo.generation.decode_attention import TRITON_AVAILABLE
from asyncppo.generation.graph_runner import RunnerSettings, decode_buckets
from asyncppo.generation.prefill_packing import prefill_buckets


@dataclass(frozen=True)
class GraphEngineSettings:
    """How the graph engine is sized and scheduled (plain values; built from the `generation` config section)."""

    max_batch_size: int
    """Most sequences decoding (or prefilling) at once."""
    max_context_length: int
    """Prompt + generated tokens of one sequence."""
    eos_token_ids: tuple[int, ...]
    seed: int
    kv_cache_tokens: int | None = None
    """KV cache size in tokens; None = from gpu_memory_utilization on CUDA, max_batch_size x 2 slots on CPU."""
    gpu_memory_utilization: float = 0.6
    """Share of the GPU's total memory the engine may bring the process to (weights, cache, graphs)."""
    prefix_cache: bool = True
    """Keep finished sequences' KV for reuse by prompts that start with the same tokens."""
    min_reused_tokens: int = 16
    """Shortest shared prefix worth taking a cached slot over for."""
    max_prefill_tokens: int = 8192
    """Tokens one prefill step computes (longer contexts are chunked over several steps)."""
    max_prefill_wait_steps: int = 8
    """Decode steps a waiting context may be held back while prefills are batched."""
    prefill_batch_ratio: int = 16
    """Prefill as soon as the contexts waiting for it number at least 1/this of the decoding rows (else they
    wait up to max_prefill_wait_steps, so that arrivals share one prefill step)."""
    max_decode_steps_per_sync: int = 8
    """Decode steps run back to back before the host reads which rows finished (never past the step where the
    last row's token budget ends, nor past the wait limit of a context waiting for prefill): the host's
    bookkeeping then overlaps the device's work. A finished row idles for at most this many - 1 steps."""
    recompute_kv_after_weight_update: bool = False
    """After new weights, recompute the KV of running rows (prompt + tokens so far) instead of keeping it."""
    use_cuda_graphs: bool | None = None
    """None = on CUDA devices."""
    compile: bool | None = None
    """None = on CUDA devices."""


def runner_settings(
    settings: GraphEngineSettings, shape_bytes_per_token: int, head_dim: int, device: torch.device
) -> RunnerSettings:
    """The runner's sizes for `settings` on `device`: as many KV slots as wanted (the largest decode bucket, plus
    max_batch_size cached prefixes with the prefix cache) and affordable; ValueError when fewer than the largest
    decode bucket fit."""
    max_positions = -(-settings.max_context_length // 16) * 16
    buckets = decode_buckets(settings.max_batch_size)
    wanted = buckets[-1] + (settings.max_batch_size if settings.prefix_cache else 0)
    slot_bytes = max_positions * shape_bytes_per_token
    if settings.kv_cache_tokens is not None:
        affordable, source = settings.kv_cache_tokens // max_positions, f"kv_cache_tokens={settings.kv_cache_tokens}"
    elif device.type == "cuda":
        free, total = torch.cuda.mem_get_info(device)
        budget = settings.gpu_memory_utilization * total - (total - free)
        affordable = int(budget // slot_bytes)
        source = (
            f"gpu_memory_utilization={settings.gpu_memory_utilization} ({budget / 2**30:.1f} GiB left of "
            f"{total / 2**30:.0f} GiB)"
        )
    else:
        affordable, source = wanted, ""
    num_slots = min(wanted, affordable)
    if num_slots < buckets[-1]:
        raise ValueError(
            f"generation: the KV cache ({source}) holds {max(affordable, 0)} sequences of {max_positions} tokens, "
            f"fewer than max_batch_size={settings.max_batch_size} (rounded to {buckets[-1]}); lower "
            "generation.max_batch_size or the context length, or raise the cache size"
        )
    on_cuda = device.type == "cuda"
    use_graphs = on_cuda if settings.use_cuda_graphs is None else settings.use_cuda_graphs
    # The kernels take the head dim as one power-of-two tile (every Llama / Qwen / Mistral size is one).
    triton_kernels = on_cuda and TRITON_AVAILABLE and head_dim >= 16 and head_dim & (head_dim - 1) == 0
    return RunnerSettings(
        num_slots=num_slots,
        max_positions=max_positions,
        max_new_tokens=max_positions,
        max_stop_ids=8,
        decode_buckets=buckets,
        window_step=256 if on_cuda else 64,
        use_cuda_graphs=use_graphs,
        compile=on_cuda if settings.compile is None else settings.compile,
        triton_kernels=triton_kernels,
        prefill_buckets=prefill_buckets(settings.max_prefill_tokens) if triton_kernels else (),
    )
