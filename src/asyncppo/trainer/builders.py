"""Builders: turn the run config into the plain arguments components take (paths, settings, factories).

Nothing below layer 4 reads a config object; everything it needs is assembled here.
"""

import functools
from collections.abc import Callable

from asyncppo.config import RunConfig
from asyncppo.config.models import PrivilegedCriticConfig, TrainedModelConfig
from asyncppo.generation.protocol import SamplingParams
from asyncppo.trainer.ppo_step import StepSettings
from asyncppo.trainer.setup import DTYPES, ModelPaths, RunSetup
from asyncppo.workers.generator_worker import GeneratorWorker, load_generator_worker
from asyncppo.workers.policy_worker import PolicyWorker, PolicyWorkerSettings
from asyncppo.workers.trained_model import TrainedModelSettings
from asyncppo.workers.value_worker import ValueWorker, ValueWorkerSettings


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
        compile=section.compile,
    )


def policy_factory(setup: RunSetup, colocated: bool) -> Callable[[], PolicyWorker]:
    """A picklable zero-argument factory of the PolicyWorker (built in its host process: the model is loaded
    there, never shipped); `colocated`: with a generation engine of its own over the same model."""
    config, section = setup.config, setup.config.model
    passes = config.ppo.ppo_epochs
    trained = _trained_model_settings(config, section, setup.paths, passes, section.max_tokens_per_microbatch)
    settings = PolicyWorkerSettings(
        **vars(trained),
        temperature=config.generation.temperature,
        logprob_chunk_size=section.logprob_chunk_size,
        loss_settings=config.loss_fn,
        keep_reference=needs_reference_logprobs(config),
    )
    engine = setup.engine if colocated else None
    return functools.partial(PolicyWorker, str(setup.paths.policy), setup.device, settings, engine)


def value_worker_settings(config: RunConfig, paths: ModelPaths) -> ValueWorkerSettings:
    """The ValueWorker's settings from the `value` and `value_loss_fn` sections (the schedule spans the PPO run)."""
    section = config.value
    assert section is not None
    # Privileged critic sequences are longer by up to the block's reserve; the budget grows with them.
    trained = _trained_model_settings(
        config, section, paths, config.ppo.resolved_critic_ppo_epochs, section.critic_max_tokens_per_microbatch
    )
    return ValueWorkerSettings(**vars(trained), loss_settings=config.value_loss_fn)


def value_factory(setup: RunSetup) -> Callable[[], ValueWorker]:
    """A picklable zero-argument factory of the ValueWorker."""
    assert setup.paths.value is not None
    settings = value_worker_settings(setup.config, setup.paths)
    return functools.partial(ValueWorker, str(setup.paths.value), setup.device, settings)


def generator_factory(setup: RunSetup, rank: int) -> Callable[[], GeneratorWorker]:
    """A picklable zero-argument factory of one non-colocated GeneratorWorker."""
    return functools.partial(
        load_generator_worker, str(setup.paths.policy), setup.dtype, setup.device, setup.engine, rank
    )
