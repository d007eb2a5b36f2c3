"""Generation: NeMo-RL's `policy.generation` (asyncppo's `generation`), its engine sections and where generators run.

asyncppo has one engine (generation.backend: graph or hf), so vLLM, SGLang, TensorRT-LLM, Dynamo and Megatron
inference settings are engine machinery; only what changes the samples is read: the length budget, sampling,
stop tokens, the memory share, colocation and the generators' devices. FP8 generation and speculative decoding
change what is sampled and asyncppo lacks them: refused when on.
"""

from typing import Any

from asyncppo.config.nemo_rl.rules import (
    Outcome,
    Rule,
    Source,
    algorithm_section,
    backend,
    feature_switch,
    lacks,
    mapped,
    neutral_when,
)

ENGINE = "asyncppo's generation engine: generation.backend=auto (graph or hf)"
WEIGHT_SYNC = "weight transfer to the generators: asyncppo's generation.weight_sync"
_FULL_PRECISIONS = ("bfloat16", "float16", "float32", "auto", None)


def _cluster_nodes(source: Source) -> Any:
    return source.get("cluster.num_nodes", 1)


def _generation_split(source: Source) -> tuple[int, int | None, str]:
    """(generation.max_new_tokens, data.max_input_seq_length or None, how they were chosen).

    NeMo-RL's default `max_new_tokens: ${policy.max_total_sequence_length}` means "up to the context": vLLM stops
    each response where prompt + response fills max_total_sequence_length. asyncppo gives every response the same
    budget, and the prompts the rest, so the port splits the context: by data.max_input_seq_length when it is
    shorter than the context, else by ppo.reward_shaping.max_response_length (the length the run shapes for),
    else in halves.
    """
    total = source.get("policy.max_total_sequence_length")
    new = source.get("policy.generation.max_new_tokens")
    prompt = source.get("data.max_input_seq_length")
    if not isinstance(total, int) or not isinstance(new, int) or new < total:
        keep_prompt = prompt if isinstance(prompt, int) and isinstance(total, int) and prompt < total else None
        return new, keep_prompt, ""
    if isinstance(prompt, int) and 0 < prompt < total:
        return total - prompt, prompt, f"{new} = the context: the context less data.max_input_seq_length={prompt}"
    shaping = f"{algorithm_section(source)}.reward_shaping"
    shaped = source.get(f"{shaping}.max_response_length")
    if source.enabled(shaping) and isinstance(shaped, int) and 0 < shaped < total:
        return shaped, total - shaped, f"{new} = the context: {shaping}.max_response_length={shaped}"
    half = total // 2
    return half, total - half, f"{new} = the context: half of it (set data.max_input_seq_length to choose the split)"


def _max_new_tokens(_key: str, _value: Any, source: Source) -> Outcome:
    new, _, how = _generation_split(source)
    return mapped("generation.max_new_tokens", new, how)


def _max_input(_key: str, value: Any, source: Source) -> Outcome:
    _, prompt, how = _generation_split(source)
    if prompt is None:
        return Outcome("neutral", "no prompt limit: asyncppo allows max_total_sequence_length - max_new_tokens")
    if prompt == value:
        return mapped("data.max_input_seq_length", prompt)
    return mapped("data.max_input_seq_length", prompt, f"the rest of the context; max_new_tokens {how}")


def _resources_gpus(_key: str, value: Any, source: Source) -> Outcome:
    # NeMo-RL's sizing: on one node the generators take gpus_per_node of it; on several they take whole nodes of
    # cluster.gpus_per_node (null there means exactly that).
    if source.enabled("policy.generation.colocated"):
        return Outcome("neutral", "colocated: generation shares the training workers' devices")
    nodes = source.get("policy.generation.colocated.resources.num_nodes")
    cluster_gpus = source.get("cluster.gpus_per_node")
    if value is None and _cluster_nodes(source) not in (None, 1) and nodes is not None:
        if not isinstance(cluster_gpus, int) or isinstance(cluster_gpus, bool):
            return Outcome("refused", f"null with cluster.gpus_per_node={cluster_gpus!r}: expected a number of GPUs")
        target = "generation.colocated.resources.gpus_per_node"
        return mapped(target, cluster_gpus, "null: whole nodes of cluster.gpus_per_node; one generator worker per GPU")
    if value is None:
        return Outcome("refused", "None: non-colocated generation needs its GPUs per node (NeMo-RL requires it too)")
    if not isinstance(value, int) or isinstance(value, bool):
        return Outcome("refused", f"{value!r}: expected a number of GPUs per node")
    return mapped("generation.colocated.resources.gpus_per_node", value, "one generator worker per GPU")


def _resources_nodes(_key: str, value: Any, source: Source) -> Outcome:
    # asyncppo's resources.num_nodes means whole nodes of their own; NeMo-RL's 1 on a one-node cluster means the
    # generators share that node, which is asyncppo's null.
    if source.enabled("policy.generation.colocated"):
        return Outcome("neutral", "colocated: generation shares the training workers' devices")
    one_shared_node = not isinstance(value, bool) and value == 1 and _cluster_nodes(source) in (None, 1)
    if value is None or one_shared_node:
        return Outcome("neutral", "the generators share the trainers' nodes; the trainers get the GPUs they leave")
    return mapped("generation.colocated.resources.num_nodes", value, "whole nodes; the trainers take the others")


def _top_k(_key: str, value: Any, _source: Source) -> Outcome:
    return mapped("generation.top_k", 0, "null = off") if value is None else mapped("generation.top_k", value)


def _val_top_k(_key: str, value: Any, source: Source) -> Outcome:
    if value == source.get("policy.generation.top_k"):
        return Outcome("neutral", "= top_k: asyncppo validates with generation.top_k")
    return Outcome("refused", f"{value!r}: {lacks('validation top_k of its own')} (it validates with top_k)")


def _engine_precision(_key: str, value: Any, _source: Source) -> Outcome:
    if value in _FULL_PRECISIONS:
        return Outcome("backend", f"engine dtype; {ENGINE} generates in model.precision")
    return Outcome("refused", f"{value!r}: {lacks('quantized (FP8) generation')}")


def _kv_cache_dtype(_key: str, value: Any, _source: Source) -> Outcome:
    if value in _FULL_PRECISIONS:
        return Outcome("backend", f"KV cache dtype; {ENGINE} keeps it in model.precision")
    return Outcome("refused", f"{value!r}: {lacks('quantized KV cache')}")


def _mcore_generation(key: str, value: Any, source: Source) -> Outcome:
    if source.get("policy.generation.backend") != "megatron":
        return Outcome(
            "backend",
            f"Megatron inference settings, unused with generation.backend={source.get('policy.generation.backend')!r}",
        )
    if key.endswith(".num_speculative_tokens"):
        return feature_switch("speculative decoding", off=(0, None))(key, value, source)
    return Outcome("backend", f"Megatron inference engine settings; {ENGINE}")


GENERATION_RULES: list[tuple[str, Rule]] = [
    ("policy.generation_batch_size", backend("generation.max_batch_size bounds asyncppo's decode batch")),
    ("policy.generation.backend", backend(ENGINE)),
    ("policy.generation.max_new_tokens", _max_new_tokens),
    ("policy.generation.top_k", _top_k),
    ("policy.generation.val_top_k", _val_top_k),
    (
        "policy.generation.stop_strings",
        neutral_when((None, []), "no stop strings: asyncppo stops on token ids", "asyncppo stops on token ids only"),
    ),
    ("policy.generation.port_range_*", backend("generation HTTP server ports; env.gym.policy_server_port")),
    ("policy.generation.refit_transport", backend(WEIGHT_SYNC)),
    ("policy.generation.refit_cfg.*", backend(WEIGHT_SYNC)),
    ("policy.generation.real_quant_export_cpu_offload", backend(WEIGHT_SYNC)),
    ("policy.generation.use_async_rollouts", backend(f"rollout driver of NeMo-RL's engines; {ENGINE}")),
    (
        "policy.generation.vllm_cfg.gpu_memory_utilization",
        lambda _k, v, _s: mapped("generation.gpu_memory_utilization", v),
    ),
    ("policy.generation.vllm_cfg.precision", _engine_precision),
    ("policy.generation.vllm_cfg.kv_cache_dtype", _kv_cache_dtype),
    ("policy.generation.vllm_cfg.*", backend(f"vLLM engine settings; {ENGINE}")),
    ("policy.generation.vllm_kwargs*", backend(f"vLLM engine settings; {ENGINE}")),
    ("policy.generation.mcore_generation_config.*", _mcore_generation),
    ("policy.generation.sglang_cfg.*", backend(f"SGLang engine settings; {ENGINE}")),
    ("policy.generation.trtllm_cfg.*", backend(f"TensorRT-LLM engine settings; {ENGINE}")),
    ("policy.generation.trtllm_kwargs*", backend(f"TensorRT-LLM engine settings; {ENGINE}")),
    ("policy.generation.dynamo_cfg.*", backend(f"Dynamo serving settings; {ENGINE}")),
    ("policy.generation.colocated.resources.gpus_per_node", _resources_gpus),
    ("policy.generation.colocated.resources.num_nodes", _resources_nodes),
    ("data.max_input_seq_length", _max_input),
]
