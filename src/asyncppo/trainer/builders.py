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

from asyncppo.algorithms.advantages import AdvantageSettings
from asyncppo.algorithms.policy_loss import PolicyLossSettings
from asyncppo.algorithms.privilege import PrivilegedField, PrivilegeSettings
from asyncppo.algorithms.value_loss import ValueLossSettings
from asyncppo.config import ConfigError, RunConfig
from asyncppo.config.models import TrainedModelConfig
from asyncppo.generation.engines import EngineSettings
from asyncppo.generation.protocol import SamplingParams
from asyncppo.models.demo_policy import ensure_arithmetic_policy
from asyncppo.models.demo_tool_policy import ensure_tool_policy
from asyncppo.models.tiny import PRESETS, ensure_tiny
from asyncppo.trainer.ppo_step import RewardScaling, RewardShaping, StepSettings
from asyncppo.workers.generator_worker import GeneratorWorker, load_generator_worker
from asyncppo.workers.groups import SyncSettings
from asyncppo.workers.optim import OptimizerSettings, SchedulerSettings
from asyncppo.workers.policy_worker import PolicyWorker, PolicyWorkerSettings
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


def optimizer_settings(section: TrainedModelConfig) -> OptimizerSettings:
    opt = section.optimizer
    return OptimizerSettings(lr=opt.lr, weight_decay=opt.weight_decay, betas=opt.betas, eps=opt.eps)


def scheduler_settings(section: TrainedModelConfig) -> SchedulerSettings:
    sched = section.scheduler
    return SchedulerSettings(
        name=sched.name,
        warmup_steps=sched.warmup_steps,
        total_steps=sched.total_steps,
        min_lr_ratio=sched.min_lr_ratio,
    )


def optimizer_steps_per_run(config: RunConfig, section: TrainedModelConfig, passes_per_step: int) -> int:
    """Optimizer steps of the whole run: steps x passes x global batches per pass (the schedule's length)."""
    batch = config.ppo.num_prompts_per_step * config.ppo.num_generations_per_prompt
    global_batch = section.train_global_batch_size or batch
    return config.ppo.max_num_steps * passes_per_step * -(-batch // global_batch)


def policy_loss_settings(config: RunConfig) -> PolicyLossSettings:
    loss = config.loss_fn
    return PolicyLossSettings(
        ratio_clip_min=loss.ratio_clip_min,
        ratio_clip_max=loss.ratio_clip_max,
        ratio_clip_c=loss.ratio_clip_c,
        disable_ppo_ratio=loss.disable_ppo_ratio,
        force_on_policy_ratio=loss.force_on_policy_ratio,
        token_level_loss=loss.token_level_loss,
        sequence_level_importance_ratios=loss.sequence_level_importance_ratios,
        reference_policy_kl_penalty=loss.reference_policy_kl_penalty,
        reference_policy_kl_type=loss.reference_policy_kl_type,
        kl_input_clamp_value=loss.kl_input_clamp_value,
        kl_output_clamp_value=loss.kl_output_clamp_value,
        use_kl_in_reward=loss.use_kl_in_reward,
        behaviour_kl_penalty=loss.behaviour_kl_penalty,
        behaviour_kl_type=loss.behaviour_kl_type,
        behaviour_kl_input_clamp_value=loss.behaviour_kl_input_clamp_value,
        behaviour_kl_output_clamp_value=loss.behaviour_kl_output_clamp_value,
        use_importance_sampling_correction=loss.use_importance_sampling_correction,
        truncated_importance_sampling_type=loss.truncated_importance_sampling_type,
        truncated_importance_sampling_ratio=loss.truncated_importance_sampling_ratio,
        truncated_importance_sampling_ratio_min=loss.truncated_importance_sampling_ratio_min,
        use_on_policy_kl_approximation=loss.use_on_policy_kl_approximation,
        positive_example_nll_weight=loss.positive_example_nll_weight,
    )


def needs_reference_logprobs(config: RunConfig) -> bool:
    """A reference KL term (in the loss or in the reward) needs the frozen reference policy."""
    return config.loss_fn.reference_policy_kl_penalty > 0 and not config.ppo.skip_reference_policy_logprobs_calculation


def advantage_settings(config: RunConfig) -> AdvantageSettings:
    est = config.ppo.adv_estimator
    loss = config.loss_fn
    return AdvantageSettings(
        name=est.name,
        normalize_advantages=bool(est.normalize_advantages),
        residual_baseline=est.residual_baseline,
        gae_gamma=est.gae_gamma,
        gae_lambda=est.gae_lambda,
        gae_lambda_value=est.gae_lambda_value,
        gae_lambda_policy=est.gae_lambda_policy,
        length_adaptive_alpha=est.length_adaptive_alpha or 0.0,
        turn_gae_gamma=est.turn_gae_gamma,
        turn_gae_lambda_value=est.turn_gae_lambda_value,
        turn_gae_lambda_policy=est.turn_gae_lambda_policy,
        use_kl_in_reward=loss.use_kl_in_reward and loss.reference_policy_kl_penalty > 0,
        kl_penalty_coef=loss.reference_policy_kl_penalty,
        kl_type=loss.reference_policy_kl_type,
        kl_input_clamp=loss.kl_input_clamp_value,
        kl_output_clamp=loss.kl_output_clamp_value,
        raw_reward_baseline=est.raw_reward_baseline,
        raw_reward_normalize_by_std=est.raw_reward_normalize_std,
    )


def step_settings(config: RunConfig) -> StepSettings:
    ppo = config.ppo
    scaling = ppo.reward_scaling
    shaping = ppo.reward_shaping
    return StepSettings(
        advantage=advantage_settings(config),
        ppo_epochs=ppo.ppo_epochs,
        critic_ppo_epochs=ppo.resolved_critic_ppo_epochs,
        policy_training_start_step=ppo.policy_training_start_step,
        log_post_update_critic_metrics=ppo.log_post_update_critic_metrics,
        homogeneous_group_weight=config.value_loss_fn.homogeneous_group_weight,
        seq_logprob_error_threshold=ppo.seq_logprob_error_threshold,
        overlong_filtering=ppo.overlong_filtering,
        need_reference_logprobs=needs_reference_logprobs(config),
        mismatch_kl_type=config.loss_fn.reference_policy_kl_type,
        privileged_critic=privilege_settings(config) is not None,
        reward_scaling=RewardScaling(scaling.source_min, scaling.source_max, scaling.target_min, scaling.target_max)
        if scaling.enabled
        else None,
        reward_shaping=RewardShaping(
            shaping.max_response_length,
            shaping.overlong_buffer_length,
            shaping.overlong_buffer_penalty,
            shaping.stop_properly_penalty_coef,
        )
        if shaping.enabled
        else None,
    )


def privilege_settings(config: RunConfig) -> PrivilegeSettings | None:
    """value.privileged_critic as plain values; None when it is off (or the run has no critic)."""
    section = config.value.privileged_critic if config.value is not None else None
    if section is None or not section.enabled:
        return None
    return PrivilegeSettings(
        fields=tuple(
            PrivilegedField(name=field.name, title=field.resolved_title, max_tokens=field.max_tokens)
            for field in section.fields
        ),
        max_total_tokens=section.max_total_tokens,
    )


def train_sampling(config: RunConfig, stop_token_ids: tuple[int, ...]) -> SamplingParams:
    gen = config.generation
    return SamplingParams(
        temperature=gen.temperature,
        top_p=gen.top_p,
        top_k=gen.top_k,
        max_new_tokens=gen.max_new_tokens,
        stop_token_ids=stop_token_ids,
        ignore_eos=gen.ignore_eos,
    )


def validation_sampling(config: RunConfig, stop_token_ids: tuple[int, ...]) -> SamplingParams:
    """Validation profile: val_temperature / val_top_p when set; temperature 0 means greedy decoding."""
    gen = config.generation
    temperature = gen.temperature if gen.val_temperature is None else gen.val_temperature
    return SamplingParams(
        temperature=temperature if temperature > 0 else 1.0,
        top_p=gen.top_p if gen.val_top_p is None else gen.val_top_p,
        top_k=gen.top_k,
        max_new_tokens=gen.max_new_tokens,
        stop_token_ids=stop_token_ids,
        greedy=temperature == 0,
    )


@dataclass(frozen=True)
class ModelPaths:
    """Resolved local directories of the run's models."""

    policy: Path
    tokenizer: Path
    value: Path | None


def model_paths(config: RunConfig) -> ModelPaths:
    policy = resolve_model_path(config.model.model_name)
    tokenizer = Path(config.model.tokenizer) if config.model.tokenizer else policy
    value = None
    if config.value is not None:
        value_name = config.value.model_name
        value = policy if value_name is None else resolve_model_path(value_name, "value.model_name")
    return ModelPaths(policy=policy, tokenizer=tokenizer, value=value)


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


def policy_factory(
    config: RunConfig, paths: ModelPaths, device: str, colocated: EngineSettings | None
) -> Callable[[], PolicyWorker]:
    """A picklable zero-argument factory of the PolicyWorker (built in its host process: the model is loaded
    there, never shipped)."""
    section = config.model
    settings = PolicyWorkerSettings(
        dtype=DTYPES[section.precision],
        tokenizer_path=str(paths.tokenizer),
        optimizer=optimizer_settings(section),
        scheduler=scheduler_settings(section),
        scheduler_total_steps=optimizer_steps_per_run(config, section, config.ppo.ppo_epochs),
        max_grad_norm=section.max_grad_norm,
        train_global_batch_size=section.train_global_batch_size,
        train_micro_batch_size=section.train_micro_batch_size,
        max_tokens_per_microbatch=section.max_tokens_per_microbatch,
        logprob_batch_size=section.logprob_batch_size,
        temperature=config.generation.temperature,
        logprob_chunk_size=section.logprob_chunk_size,
        loss_settings=policy_loss_settings(config),
        keep_reference=needs_reference_logprobs(config),
        activation_checkpointing=section.activation_checkpointing,
    )
    return functools.partial(PolicyWorker, str(paths.policy), device, settings, colocated)


def value_factory(config: RunConfig, paths: ModelPaths, device: str) -> Callable[[], ValueWorker]:
    """A picklable zero-argument factory of the ValueWorker."""
    section = config.value
    assert section is not None and paths.value is not None
    settings = ValueWorkerSettings(
        dtype=DTYPES[section.precision],
        tokenizer_path=str(paths.tokenizer),
        optimizer=optimizer_settings(section),
        scheduler=scheduler_settings(section),
        scheduler_total_steps=optimizer_steps_per_run(config, section, config.ppo.resolved_critic_ppo_epochs),
        max_grad_norm=section.max_grad_norm,
        train_global_batch_size=section.train_global_batch_size,
        train_micro_batch_size=section.train_micro_batch_size,
        # Privileged critic sequences are longer by up to the block's reserve; the budget grows with them.
        max_tokens_per_microbatch=section.critic_max_tokens_per_microbatch,
        logprob_batch_size=section.logprob_batch_size,
        loss_settings=ValueLossSettings(scale=config.value_loss_fn.scale, cliprange=config.value_loss_fn.cliprange),
        activation_checkpointing=section.activation_checkpointing,
    )
    return functools.partial(ValueWorker, str(paths.value), device, settings)


def generator_factory(
    config: RunConfig, paths: ModelPaths, device: str, engine: EngineSettings, rank: int
) -> Callable[[], GeneratorWorker]:
    """A picklable zero-argument factory of one non-colocated GeneratorWorker."""
    return functools.partial(
        load_generator_worker, str(paths.policy), DTYPES[config.model.precision], device, engine, rank
    )


def sync_settings(config: RunConfig) -> SyncSettings:
    sync = config.generation.weight_sync
    return SyncSettings(
        bucket_size_bytes=sync.bucket_size_mb * 1024 * 1024,
        timeout_s=sync.timeout_s,
        checksum_period=sync.checksum_period,
    )
