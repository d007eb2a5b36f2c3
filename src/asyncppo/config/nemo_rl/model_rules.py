"""The trained models: NeMo-RL's `policy` (asyncppo's `model`) and `value` sections, their optimizers, schedules,
batching and the backend sections (DTensor, Megatron) asyncppo's training workers replace.

Inside a backend section only the keys that change what is trained are read: activation checkpointing, the
Megatron optimizer and schedule (when Megatron is the enabled backend), and the switches of features asyncppo
lacks (LoRA, FP8 training, multi-token prediction), which are refused when on.
"""

from typing import Any

from asyncppo.config.nemo_rl.optimizers import (
    megatron_optimizer,
    megatron_scheduler,
    scheduler_outcome,
    torch_optimizer_name,
)
from asyncppo.config.nemo_rl.rules import (
    Outcome,
    Rule,
    Source,
    backend,
    feature_settings,
    feature_switch,
    lacks,
    mapped,
    neutral_when,
    same_as,
)

WORKERS = "asyncppo's training workers (cluster.device, one device each)"


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


def _while_enabled(config: str, rule: Rule) -> Rule:
    """`rule` for a key of the backend section `<model>.<config>`, read only while that backend is enabled."""

    def gated(key: str, value: Any, source: Source) -> Outcome:
        section = key.split(".")[0]
        if not source.enabled(f"{section}.{config}"):
            return Outcome("backend", f"{section}.{config} is disabled")
        return rule(key, value, source)

    return gated


def _logprob_chunk_size(target: str | None) -> Rule:
    def rule(_key: str, value: Any, _source: Source) -> Outcome:
        if value is None or target is None:
            where = f"{target}" if target is not None else "the policy's model.logprob_chunk_size"
            return Outcome("backend", f"memory only: asyncppo chunks log-probabilities by {where}")
        return mapped(target, value)

    return rule


def _backend_features(src: str) -> list[tuple[str, Rule]]:
    """The switches inside DTensor / Megatron sections that change what is trained, refused when on."""
    return [
        (f"{src}.dtensor_cfg.lora_cfg.enabled", _while_enabled("dtensor_cfg", feature_switch("LoRA adapters"))),
        (f"{src}.dtensor_cfg.lora_cfg.*", _while_enabled("dtensor_cfg", feature_settings("enabled", "LoRA"))),
        (f"{src}.megatron_cfg.peft.enabled", _while_enabled("megatron_cfg", feature_switch("LoRA adapters"))),
        (f"{src}.megatron_cfg.peft.*", _while_enabled("megatron_cfg", feature_settings("enabled", "LoRA"))),
        (f"{src}.megatron_cfg.fp8_cfg.enabled", _while_enabled("megatron_cfg", feature_switch("FP8 training"))),
        (f"{src}.megatron_cfg.fp8_cfg.*", _while_enabled("megatron_cfg", feature_settings("enabled", "FP8"))),
        (
            f"{src}.megatron_cfg.mtp_num_layers",
            _while_enabled("megatron_cfg", feature_switch("multi-token prediction", off=(0, None))),
        ),
        (
            f"{src}.megatron_cfg.model_overrides",
            _while_enabled(
                "megatron_cfg",
                neutral_when((None, {}), "no overrides: the model as published", lacks("model provider overrides")),
            ),
        ),
    ]


def _model_rules(src: str, dst: str) -> list[tuple[str, Rule]]:
    """Rules of a trained model's section: NeMo-RL's `policy` / `value` -> asyncppo's `model` / `value`."""
    return [
        (f"{src}.tokenizer.name", _value_tokenizer if src == "value" else same_as(f"{dst}.tokenizer")),
        (
            f"{src}.tokenizer.chat_template_kwargs*",
            neutral_when((None, {}), "none: the chat template's defaults", lacks("chat-template arguments")),
        ),
        (
            f"{src}.tokenizer.chat_template",
            neutral_when((None,), "the tokenizer's own chat template", lacks("custom chat template")),
        ),
        (f"{src}.tokenizer.use_fastokens", backend("tokenizer implementation; asyncppo uses transformers'")),
        (
            f"{src}.offload_optimizer_for_logprob",
            lambda _k, v, _s: (
                Outcome("neutral", "off: the optimizer stays where asyncppo keeps it")
                if v in (False, None)
                else Outcome("backend", f"memory placement; {WORKERS}")
            ),
        ),
        (f"{src}.logprob_chunk_size", _logprob_chunk_size("model.logprob_chunk_size" if src == "policy" else None)),
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
        *_backend_features(src),
        (f"{src}.dtensor_cfg.*", backend(f"DTensor sharding; {WORKERS}")),
        (f"{src}.megatron_cfg.*", backend(f"Megatron parallelism; {WORKERS}")),
        (f"{src}.dynamic_batching.train_mb_tokens", _micro_batch_tokens(dst)),
        (f"{src}.dynamic_batching.*", backend(f"asyncppo sizes micro-batches by {dst}.max_tokens_per_microbatch")),
        (
            f"{src}.sequence_packing.*",
            backend(
                f"{dst}.sequence_packing packs micro-batches (default: on CUDA); "
                f"{dst}.max_tokens_per_microbatch bounds them"
            ),
        ),
        (f"{src}.make_sequence_length_divisible_by", backend(f"padding for sharded kernels; {WORKERS}")),
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
        (f"{src}.draft.enabled", feature_switch("speculative-decoding draft model")),
        (f"{src}.draft.*", feature_settings("enabled", "the draft model")),
        (f"{src}.router_replay.enabled", feature_switch("MoE router replay")),
        (f"{src}.router_replay.*", feature_settings("enabled", "router replay")),
    ]


def _reward_model_head(key: str, value: Any, source: Source) -> Outcome:
    if source.enabled("value.megatron_cfg"):
        return Outcome("backend", "read by the DTensor value worker only; asyncppo's critic has a scalar head")
    expected = True if key.endswith(".enabled") else "regression"
    if value == expected and isinstance(value, bool) == isinstance(expected, bool):
        return Outcome("neutral", "asyncppo's critic is a scalar regression head")
    return Outcome("refused", f"{value!r}: {lacks('critic head of another kind')} (a scalar regression head only)")


MODEL_RULES: list[tuple[str, Rule]] = [
    *_model_rules("policy", "model"),
    *_model_rules("value", "value"),
    ("value.reward_model_cfg.*", _reward_model_head),
]
