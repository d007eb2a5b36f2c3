"""The key mapping table from NeMo-RL's PPO config to asyncppo's, one rule per key pattern.

`rule_for(key)` returns the first rule whose pattern (`fnmatch`, `*` spans dots) matches the dotted key. Keys
no pattern names fall back to the same key in asyncppo's schema (with NeMo-RL's `policy` read as `model` and
`env.nemo_gym` as `env.gym`): `ppo.*`, `loss_fn.*` and `value_loss_fn.*` keep NeMo-RL's names. A key with no
counterpart at all is refused.
"""

from fnmatch import fnmatchcase
from typing import Any

from asyncppo.config.nemo_rl.optimizers import (
    megatron_optimizer,
    megatron_scheduler,
    scheduler_outcome,
    torch_optimizer_name,
)
from asyncppo.config.nemo_rl.rules import Outcome, Rule, Source, backend, mapped, neutral_when, refuse, same_as
from asyncppo.config.schema import RunConfig
from asyncppo.config.schema_walk import UnknownKeyError, find_field

NEMO_GYM_HEAD_SERVER = "http://127.0.0.1:11000"
"""Where NeMo-Gym's head server listens by default; a ported gym run connects there."""
_WORKERS = "asyncppo's training workers (cluster.device, one device each)"
_ENGINE = "asyncppo's generation engine: generation.backend=auto (graph or hf)"
_METRIC_NAMES = {"val:accuracy": "val:reward_mean", "val_reward": "val:reward_mean", "val_accuracy": "val:reward_mean"}


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
    shaped = source.get("ppo.reward_shaping.max_response_length")
    if source.enabled("ppo.reward_shaping") and isinstance(shaped, int) and 0 < shaped < total:
        return shaped, total - shaped, f"{new} = the context: ppo.reward_shaping.max_response_length={shaped}"
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


def _cluster_nodes(source: Source) -> Any:
    return source.get("cluster.num_nodes", 1)


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


def _cluster_gpus(key: str, value: Any, source: Source) -> Outcome:
    # Mapped as it is; a colocated run over several GPUs says here why `asyncppo train` will stop at start.
    nodes = _cluster_nodes(source)
    colocated = source.enabled("policy.generation.colocated")
    if not colocated or not isinstance(value, int) or not isinstance(nodes, int) or value * nodes <= 1:
        return mapped(key, value)
    return mapped(
        key,
        value,
        f"colocated: {value * nodes} trainer ranks, refused at start since a colocated engine cannot run over FSDP "
        "shards; override cluster.gpus_per_node=1 or generate non-colocated",
    )


def _top_k(_key: str, value: Any, _source: Source) -> Outcome:
    return mapped("generation.top_k", 0, "null = off") if value is None else mapped("generation.top_k", value)


def _metric_name(_key: str, value: Any, _source: Source) -> Outcome:
    if isinstance(value, str) and value in _METRIC_NAMES:
        return mapped("checkpointing.metric_name", _METRIC_NAMES[value], f"NeMo-RL's {value}")
    return mapped("checkpointing.metric_name", value)


def _nemo_gym_configs(_key: str, value: Any, _source: Source) -> Outcome:
    return Outcome(
        "mapped",
        f"env.gym.launch=external, env.gym.head_server_url={NEMO_GYM_HEAD_SERVER} (asyncppo does not launch "
        f"NeMo-Gym: start the servers of {value} yourself)",
        {"env.gym.launch": "external", "env.gym.head_server_url": NEMO_GYM_HEAD_SERVER},
    )


def _dataset_name(_key: str, value: Any, _source: Source) -> Outcome:
    if value is None:
        return Outcome("neutral", "no named dataset (the data paths are used)")
    return mapped("data.train_path", value, "a JSONL file or local datasets directory must be at this path")


def _value_tokenizer(_key: str, value: Any, source: Source) -> Outcome:
    if value in (source.get("policy.tokenizer.name"), None):
        return Outcome("neutral", "the critic uses the policy's tokenizer (model.tokenizer)")
    return Outcome("refused", f"{value!r}: the critic scores the policy's tokens with the policy's tokenizer")


def _activation_checkpointing(section: str) -> Rule:
    def rule(key: str, value: Any, source: Source) -> Outcome:
        backend_cfg = key.rpartition(".")[0]
        if not source.enabled(backend_cfg):
            return Outcome("backend", f"{backend_cfg} is disabled")
        return mapped(f"{section}.activation_checkpointing", value)

    return rule


def _micro_batch_tokens(section: str) -> Rule:
    def rule(key: str, value: Any, source: Source) -> Outcome:
        if not source.enabled(key.rpartition(".")[0]):
            return Outcome("backend", f"disabled; asyncppo batches by {section}.train_micro_batch_size")
        return mapped(f"{section}.max_tokens_per_microbatch", value, "micro-batches packed by tokens")

    return rule


def _no_torch_optimizer(key: str, value: Any, source: Source) -> Outcome:
    """`optimizer: null`, as Megatron configs write it: megatron_cfg.optimizer must then be enabled."""
    if value is None and source.enabled(f"{key.rpartition('.')[0]}.megatron_cfg"):
        return Outcome("backend", "megatron_cfg.optimizer takes its role (mapped from there)")
    return Outcome("refused", f"{value!r}: expected {{name, kwargs}} or null beside an enabled megatron_cfg")


def _model_rules(src: str, dst: str) -> list[tuple[str, Rule]]:
    """Rules of a trained model's section: NeMo-RL's `policy` / `value` -> asyncppo's `model` / `value`."""
    return [
        (f"{src}.tokenizer.name", _value_tokenizer if src == "value" else same_as(f"{dst}.tokenizer")),
        (f"{src}.optimizer.name", torch_optimizer_name),
        (f"{src}.optimizer", _no_torch_optimizer),
        (f"{src}.optimizer.kwargs.lr", same_as(f"{dst}.optimizer.lr")),
        (f"{src}.optimizer.kwargs.weight_decay", same_as(f"{dst}.optimizer.weight_decay")),
        (f"{src}.optimizer.kwargs.betas", same_as(f"{dst}.optimizer.betas")),
        (f"{src}.optimizer.kwargs.eps", same_as(f"{dst}.optimizer.eps")),
        (f"{src}.optimizer.kwargs.foreach", backend("torch kernel choice; asyncppo picks its AdamW implementation")),
        (f"{src}.optimizer.kwargs.fused", backend("torch kernel choice; asyncppo picks its AdamW implementation")),
        (f"{src}.scheduler", lambda k, v, s: scheduler_outcome(k, v, s, dst)),
        (f"{src}.dtensor_cfg.activation_checkpointing", _activation_checkpointing(dst)),
        (f"{src}.megatron_cfg.activation_checkpointing", _activation_checkpointing(dst)),
        (f"{src}.megatron_cfg.optimizer.*", lambda k, v, s: megatron_optimizer(k, v, s, dst)),
        (f"{src}.megatron_cfg.scheduler.*", lambda k, v, s: megatron_scheduler(k, v, s, dst)),
        (f"{src}.dtensor_cfg.*", backend(f"DTensor sharding; {_WORKERS}")),
        (f"{src}.megatron_cfg.*", backend(f"Megatron parallelism; {_WORKERS}")),
        (f"{src}.dynamic_batching.train_mb_tokens", _micro_batch_tokens(dst)),
        (f"{src}.dynamic_batching.*", backend(f"asyncppo sizes micro-batches by {dst}.max_tokens_per_microbatch")),
        (
            f"{src}.sequence_packing.*",
            backend(
                f"{dst}.sequence_packing packs micro-batches (default: on CUDA); "
                f"{dst}.max_tokens_per_microbatch bounds them"
            ),
        ),
        (f"{src}.make_sequence_length_divisible_by", backend(f"padding for sharded kernels; {_WORKERS}")),
        (
            f"{src}.hf_config_overrides*",
            neutral_when(
                (None, {}),
                "no overrides: the model's own config, as asyncppo loads it",
                "asyncppo loads the model's own config",
            ),
        ),
        (
            f"{src}.dequantize_base_checkpoint",
            neutral_when(
                (False, None), "off: unquantized weights, as asyncppo loads", "asyncppo loads unquantized weights only"
            ),
        ),
    ]


RULES: list[tuple[str, Rule]] = [
    *_model_rules("policy", "model"),
    *_model_rules("value", "value"),
    ("policy.generation_batch_size", backend("generation.max_batch_size bounds asyncppo's decode batch")),
    ("policy.generation.backend", backend(_ENGINE)),
    ("policy.generation.max_new_tokens", _max_new_tokens),
    ("policy.generation.top_k", _top_k),
    (
        "policy.generation.stop_strings",
        neutral_when((None, []), "no stop strings: asyncppo stops on token ids", "asyncppo stops on token ids only"),
    ),
    ("policy.generation.vllm_cfg.gpu_memory_utilization", same_as("generation.gpu_memory_utilization")),
    ("policy.generation.vllm_cfg.*", backend(f"vLLM engine settings; {_ENGINE}")),
    ("policy.generation.vllm_kwargs*", backend(f"vLLM engine settings; {_ENGINE}")),
    ("policy.generation.colocated.resources.gpus_per_node", _resources_gpus),
    ("policy.generation.colocated.resources.num_nodes", _resources_nodes),
    (
        "value.reward_model_cfg.enabled",
        neutral_when((True,), "asyncppo's critic always has a scalar head", "needs a head"),
    ),
    (
        "value.reward_model_cfg.reward_model_type",
        neutral_when(("regression",), "asyncppo's critic is a regression head", "regression"),
    ),
    (
        "value.privileged_critic.enabled",
        neutral_when((False,), "off, as asyncppo's default", "set value.privileged_critic.fields by hand"),
    ),
    ("value.privileged_critic.*", backend("privileged critic is off; asyncppo's is value.privileged_critic.fields")),
    (
        "value.swe_privileged_critic.enabled",
        neutral_when((False,), "off, as asyncppo runs", "asyncppo has no SWE privileged critic"),
    ),
    ("value.swe_privileged_critic.*", backend("SWE privileged critic is off")),
    ("ppo.val_batch_size", backend("asyncppo validates in decode batches of generation.max_batch_size")),
    ("ppo.calculate_advantages_on_gpu", backend("advantages are computed where asyncppo's driver runs")),
    (
        "ppo.max_rollout_turns",
        lambda k, v, s: (
            same_as(k)(k, v, s) if v is not None else Outcome("neutral", "no cap: gym agents bound their turns")
        ),
    ),
    ("data.dataset_name", _dataset_name),
    ("data.train_jsonl_fpath", same_as("data.train_path")),
    ("data.validation_jsonl_fpath", same_as("data.validation_path")),
    ("data.max_input_seq_length", _max_input),
    (
        "data.prompt_file",
        neutral_when(
            (None,),
            "no template: rows are rendered as written",
            "asyncppo renders rows as written: bake it into the data",
        ),
    ),
    (
        "data.system_prompt_file",
        neutral_when(
            (None,), "no system prompt file (data.system_prompt)", "copy the file's text into data.system_prompt"
        ),
    ),
    ("env.math.*", backend("the math reward runs in asyncppo's driver (env.reward_function=math)")),
    ("env.nemo_gym.config_paths", _nemo_gym_configs),
    ("env.nemo_gym.port_range_*", backend("NeMo-Gym server ports; env.gym.policy_server_port")),
    (
        "env.nemo_gym.num_gpu_nodes",
        neutral_when((0, None), "no GPU nodes for gym servers", "asyncppo does not place gym servers on GPUs"),
    ),
    ("checkpointing.metric_name", _metric_name),
    (
        "checkpointing.save_optimizer",
        neutral_when((True,), "asyncppo checkpoints always hold the optimizer", "asyncppo resumes with the optimizer"),
    ),
    ("checkpointing.model_save_format", backend("asyncppo writes its own checkpoint layout (safetensors)")),
    ("checkpointing.save_consolidated", backend("asyncppo's checkpoints are single-device, never sharded")),
    ("cluster.gpus_per_node", _cluster_gpus),
    ("cluster.segment_size", backend("NVLink-domain placement; asyncppo packs each worker group (Ray PACK)")),
    ("cluster.master_port_range_*", backend("torch.distributed ports; asyncppo's weight sync picks its own")),
    ("logger.monitor_gpus", backend("GPU monitor; asyncppo logs timing/* and memory in metrics.jsonl")),
    ("logger.gpu_monitoring.*", backend("GPU monitor; asyncppo logs timing/* and memory in metrics.jsonl")),
    ("logger.num_val_samples_to_print", backend("console sample printing; see the run's rollout dumps")),
    ("logger.tensorboard", backend("TensorBoard writes to the run directory: logger.tensorboard_enabled")),
    ("logger.tensorboard.*", backend("TensorBoard writes to the run directory: logger.tensorboard_enabled")),
    (
        "logger.swanlab_enabled",
        neutral_when((False,), "off: asyncppo has no SwanLab sink", "asyncppo has no SwanLab sink"),
    ),
]


def _schema_key(key: str) -> str:
    """The asyncppo key of the same meaning by name: `policy.` -> `model.`, `env.nemo_gym.` -> `env.gym.`."""
    if key.startswith("policy.generation."):
        return key.removeprefix("policy.")
    if key.startswith("policy."):
        return "model." + key.removeprefix("policy.")
    if key.startswith("env.nemo_gym."):
        return "env.gym." + key.removeprefix("env.nemo_gym.")
    return key


def outcome_for(key: str, value: Any, source: Source) -> Outcome:
    """What the port does with `key` (dotted, NeMo-RL's) holding `value`."""
    for pattern, rule in RULES:
        if fnmatchcase(key, pattern):
            return rule(key, value, source)
    target = _schema_key(key)
    try:
        field = find_field(RunConfig, target)
    except UnknownKeyError:
        return refuse("no asyncppo key of this name or meaning")(key, value, source)
    if field.section is not None and not field.free_form:
        return refuse("a section here, a value in asyncppo's schema")(key, value, source)
    return mapped(target, value)
