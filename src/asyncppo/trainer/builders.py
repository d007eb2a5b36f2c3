"""Builders: turn the run config into the plain arguments components take (paths, settings, factories).

Nothing below layer 4 reads a config object; everything it needs is assembled here.
"""

import functools
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import PreTrainedTokenizerBase

from asyncppo.config import ConfigError, RunConfig
from asyncppo.config.models import PrivilegedCriticConfig, TrainedModelConfig
from asyncppo.demo.arithmetic_policy import ensure_arithmetic_policy
from asyncppo.demo.tool_policy import ensure_tool_policy
from asyncppo.generation.engines import EngineSettings
from asyncppo.generation.protocol import SamplingParams
from asyncppo.models.tiny import PRESETS, ensure_tiny
from asyncppo.trainer.ppo_step import StepSettings
from asyncppo.workers.generator_worker import GeneratorWorker, load_generator_worker
from asyncppo.workers.policy_worker import PolicyWorker, PolicyWorkerSettings
from asyncppo.workers.trained_model import TrainedModelSettings
from asyncppo.workers.value_worker import ValueWorker, ValueWorkerSettings

TINY_PREFIX = "tiny:"
DEMO_PREFIX = "demo:"
DEMO_MODELS = {"arithmetic": ensure_arithmetic_policy, "multi_step": ensure_tool_policy}


def cache_dir() -> Path:
    """Where locally built artifacts (tiny and demo models) are cached: $ASYNCPPO_CACHE_DIR or ~/.cache/asyncppo."""
    return Path(os.environ.get("ASYNCPPO_CACHE_DIR", Path.home() / ".cache" / "asyncppo"))


def resolve_model_path(model_name: str, key: str = "model.model_name") -> Path:
    """A local model directory: `tiny:<preset>` and `demo:<name>` are built (once) into the cache."""
    if model_name.startswith(TINY_PREFIX):
        preset = model_name.removeprefix(TINY_PREFIX)
        if preset not in PRESETS:
            raise ConfigError([f"{key}: unknown tiny preset {preset!r}; expected one of {sorted(PRESETS)}"])
        return ensure_tiny(cache_dir() / "models", preset)
    if model_name.startswith(DEMO_PREFIX):
        name = model_name.removeprefix(DEMO_PREFIX)
        if name not in DEMO_MODELS:
            raise ConfigError([f"{key}: unknown demo model {name!r}; expected one of {sorted(DEMO_MODELS)}"])
        return DEMO_MODELS[name](cache_dir() / "models")
    path = Path(model_name).expanduser()
    if not (path / "config.json").is_file():
        raise ConfigError([f"{key}: {model_name!r} is not a local Hugging Face model directory (no config.json)"])
    return path


def resolve_device(config: RunConfig) -> str:
    """`cuda` or `cpu` from cluster.device (auto = CUDA when the driver sees a GPU)."""
    wanted = config.cluster.device
    if wanted == "cuda" and not torch.cuda.is_available():
        raise ConfigError(["cluster.device: 'cuda' but no CUDA device is visible"])
    if wanted == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return wanted


DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def optimizer_steps_per_run(config: RunConfig, section: TrainedModelConfig, passes_per_step: int) -> int:
    """Optimizer steps of the whole run: steps x passes x global batches per pass (the schedule's length)."""
    return config.ppo.max_num_steps * passes_per_step * config.optimizer_steps_per_pass(section)


def needs_reference_logprobs(config: RunConfig) -> bool:
    """A reference KL term (in the loss or in the reward) needs the frozen reference policy."""
    return config.loss_fn.reference_policy_kl_penalty > 0 and not config.ppo.skip_reference_policy_logprobs_calculation


def step_settings(config: RunConfig) -> StepSettings:
    ppo = config.ppo
    return StepSettings(
        advantage=ppo.adv_estimator,
        policy_loss=config.loss_fn,
        ppo_epochs=ppo.ppo_epochs,
        critic_ppo_epochs=ppo.resolved_critic_ppo_epochs,
        policy_training_start_step=ppo.policy_training_start_step,
        log_post_update_critic_metrics=ppo.log_post_update_critic_metrics,
        homogeneous_group_weight=config.value_loss_fn.homogeneous_group_weight,
        seq_logprob_error_threshold=ppo.seq_logprob_error_threshold,
        overlong_filtering=ppo.overlong_filtering,
        need_reference_logprobs=needs_reference_logprobs(config),
        privileged_critic=enabled_privileged_critic(config) is not None,
        reward_scaling=ppo.reward_scaling if ppo.reward_scaling.enabled else None,
        reward_shaping=ppo.reward_shaping if ppo.reward_shaping.enabled else None,
        old_logprobs_from_training=old_logprobs_from_training(config),
        policy_global_batch_size=config.model.train_global_batch_size,
    )


def old_logprobs_from_training(config: RunConfig) -> bool:
    """Whether the policy pass's own first forward may give the step's old logprobs, saving a scoring pass.

    The old logprobs are the current policy's logprobs of the batch, scored before any update. The training
    pass computes exactly those in its forwards (dropout is off, so train and eval forwards agree) as long as no
    optimizer step lands between them and nothing reads them before the pass. That holds when:
    - ppo.ppo_epochs == 1: one pass per step (a second pass would start from updated weights);
    - the pass is one global batch: checked per step (`StepSettings.one_global_batch`), as batches may shrink;
    - the KL term is not in the reward (loss_fn.use_kl_in_reward feeds old logprobs into the advantages);
    - no sequence masking by logprob error (ppo.seq_logprob_error_threshold decides which samples train).
    The mismatch metrics are then computed after the pass, from the same numbers.
    """
    return (
        config.ppo.ppo_epochs == 1
        and not config.loss_fn.uses_kl_in_reward
        and config.ppo.seq_logprob_error_threshold is None
    )


def enabled_privileged_critic(config: RunConfig) -> PrivilegedCriticConfig | None:
    """The value.privileged_critic section when it is on; None when it is off (or the run has no critic)."""
    section = config.value.privileged_critic if config.value is not None else None
    return section if section is not None and section.enabled else None


def train_sampling(config: RunConfig, stop_token_ids: tuple[int, ...]) -> SamplingParams:
    gen = config.generation
    return SamplingParams.for_profile(
        gen.train_profile, gen.max_new_tokens, top_k=gen.top_k, stop_token_ids=stop_token_ids, ignore_eos=gen.ignore_eos
    )


def validation_sampling(config: RunConfig, stop_token_ids: tuple[int, ...]) -> SamplingParams:
    """Validation profile: val_temperature / val_top_p when set; temperature 0 means greedy decoding."""
    gen = config.generation
    return SamplingParams.for_profile(
        gen.validation_profile, gen.max_new_tokens, top_k=gen.top_k, stop_token_ids=stop_token_ids
    )


@dataclass(frozen=True)
class ModelPaths:
    """Resolved local directories of the run's models; `resolve` builds tiny and demo models on first use."""

    policy: Path
    tokenizer: Path
    value: Path | None

    @classmethod
    def resolve(cls, config: RunConfig) -> "ModelPaths":
        """model.model_name, model.tokenizer (null = the policy's directory) and value.model_name (null = the
        policy's model; None without a critic). A name that is neither a built name nor a local directory is a
        ConfigError naming its key, before anything loads."""
        policy = resolve_model_path(config.model.model_name)
        tokenizer = resolve_model_path(config.model.tokenizer, "model.tokenizer") if config.model.tokenizer else policy
        value = None
        if config.value is not None:
            value_name = config.value.model_name
            value = policy if value_name is None else resolve_model_path(value_name, "value.model_name")
        return cls(policy=policy, tokenizer=tokenizer, value=value)


def end_and_pad_ids(
    config: RunConfig, tokenizer: PreTrainedTokenizerBase, tokenizer_path: Path
) -> tuple[tuple[int, ...], int]:
    """(ids that end a generation: EOS plus generation.stop_token_ids, pad id: the tokenizer's or EOS)."""

    def token_id(value: object, name: str) -> int:
        if not isinstance(value, int):
            raise ConfigError(
                [f"model.tokenizer: the tokenizer at {tokenizer_path} has {name}={value!r}; generation needs one id"]
            )
        return value

    eos_id = token_id(tokenizer.eos_token_id, "eos_token_id")
    stop_ids: list[int] = list(config.generation.stop_token_ids or [])
    pad = eos_id if tokenizer.pad_token_id is None else token_id(tokenizer.pad_token_id, "pad_token_id")
    return tuple(sorted({eos_id, *stop_ids})), pad


def engine_settings(config: RunConfig, eos_token_ids: tuple[int, ...], pad_token_id: int) -> EngineSettings:
    generation = config.generation
    return EngineSettings(
        max_batch_size=generation.max_batch_size,
        max_context_length=config.model.max_total_sequence_length,
        seed=config.ppo.seed,
        eos_token_ids=eos_token_ids,
        pad_token_id=pad_token_id,
        backend=generation.backend,
        gpu_memory_utilization=generation.gpu_memory_utilization,
        kv_cache_tokens=generation.kv_cache_tokens,
        prefix_cache=generation.enable_prefix_caching,
        recompute_kv_after_weight_update=config.ppo.async_ppo.recompute_kv_cache_after_weight_updates,
    )


def _trained_model_settings(
    config: RunConfig, section: TrainedModelConfig, paths: ModelPaths, passes_per_step: int, max_tokens: int | None
) -> TrainedModelSettings:
    """What the policy and the value model both take from their section (`model` or `value`)."""
    return TrainedModelSettings(
        dtype=DTYPES[section.precision],
        tokenizer_path=str(paths.tokenizer),
        optimizer=section.optimizer,
        scheduler=section.scheduler,
        scheduler_total_steps=optimizer_steps_per_run(config, section, passes_per_step),
        max_grad_norm=section.max_grad_norm,
        train_global_batch_size=section.train_global_batch_size,
        train_micro_batch_size=section.train_micro_batch_size,
        max_tokens_per_microbatch=max_tokens,
        sequence_packing=section.sequence_packing,
        logprob_batch_size=section.logprob_batch_size,
        activation_checkpointing=section.activation_checkpointing,
    )


def policy_factory(
    config: RunConfig, paths: ModelPaths, device: str, colocated: EngineSettings | None
) -> Callable[[], PolicyWorker]:
    """A picklable zero-argument factory of the PolicyWorker (built in its host process: the model is loaded
    there, never shipped)."""
    section = config.model
    trained = _trained_model_settings(config, section, paths, config.ppo.ppo_epochs, section.max_tokens_per_microbatch)
    settings = PolicyWorkerSettings(
        **vars(trained),
        temperature=config.generation.temperature,
        logprob_chunk_size=section.logprob_chunk_size,
        loss_settings=config.loss_fn,
        keep_reference=needs_reference_logprobs(config),
    )
    return functools.partial(PolicyWorker, str(paths.policy), device, settings, colocated)


def value_worker_settings(config: RunConfig, paths: ModelPaths) -> ValueWorkerSettings:
    """The ValueWorker's settings from the `value` and `value_loss_fn` sections (the schedule spans the PPO run)."""
    section = config.value
    assert section is not None
    # Privileged critic sequences are longer by up to the block's reserve; the budget grows with them.
    trained = _trained_model_settings(
        config, section, paths, config.ppo.resolved_critic_ppo_epochs, section.critic_max_tokens_per_microbatch
    )
    return ValueWorkerSettings(**vars(trained), loss_settings=config.value_loss_fn)


def value_factory(config: RunConfig, paths: ModelPaths, device: str) -> Callable[[], ValueWorker]:
    """A picklable zero-argument factory of the ValueWorker."""
    assert paths.value is not None
    return functools.partial(ValueWorker, str(paths.value), device, value_worker_settings(config, paths))


def generator_factory(
    config: RunConfig, paths: ModelPaths, device: str, engine: EngineSettings, rank: int
) -> Callable[[], GeneratorWorker]:
    """A picklable zero-argument factory of one non-colocated GeneratorWorker."""
    return functools.partial(
        load_generator_worker, str(paths.policy), DTYPES[config.model.precision], device, engine, rank
    )
