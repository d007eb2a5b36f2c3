"""The run config: one pydantic tree of every section, and the rules that span sections.

Builders in `trainer/` read this tree and hand plain arguments to components; nothing below layer 4 takes
a config object whole (the "no intrusive configs" rule).
"""

from typing import Any, Self

from pydantic import ModelWrapValidatorHandler, ValidationInfo, model_validator

from asyncppo.config.base import RuleError, Section, add_note
from asyncppo.config.critic_pretrain import CriticPretrainConfig
from asyncppo.config.data import DataConfig
from asyncppo.config.logger import LoggerConfig
from asyncppo.config.losses import PolicyLossConfig, ValueLossConfig
from asyncppo.config.models import PolicyModelConfig, TrainedModelConfig, ValueModelConfig
from asyncppo.config.ppo import PPOConfig
from asyncppo.config.runtime import (
    CheckpointingConfig,
    ClusterConfig,
    EnvConfig,
    GenerationConfig,
    RewardPenaltiesConfig,
)


class RunConfig(Section):
    """Everything a training run needs."""

    model: PolicyModelConfig
    """The policy model and its training."""
    value: ValueModelConfig | None = None
    """The critic and its training; required unless ppo.adv_estimator.name is raw_reward, which trains no critic
    (a value section is then validated, dropped and reported as ignored)."""
    data: DataConfig
    """Training and validation data."""
    generation: GenerationConfig = GenerationConfig()
    """Sampling and the generation engine."""
    env: EnvConfig = EnvConfig()
    """Rewards and environments."""
    ppo: PPOConfig
    """The PPO loop."""
    loss_fn: PolicyLossConfig = PolicyLossConfig()
    """Policy loss."""
    value_loss_fn: ValueLossConfig = ValueLossConfig()
    """Value loss."""
    reward_penalties: RewardPenaltiesConfig = RewardPenaltiesConfig()
    """Gym reward zeroing."""
    cluster: ClusterConfig = ClusterConfig()
    """Devices and Ray."""
    checkpointing: CheckpointingConfig = CheckpointingConfig()
    """Checkpoints and resume."""
    logger: LoggerConfig = LoggerConfig()
    """Metric sinks and the run directory."""
    critic_pretrain: CriticPretrainConfig = CriticPretrainConfig()
    """Offline critic pretraining (`asyncppo critic collect` / `critic pretrain`); PPO ignores it."""

    @model_validator(mode="after")
    def _check_cross_section_rules(self) -> Self:
        self._check_critic()
        self._check_async()
        self._check_kl()
        self._check_gym()
        self._check_ranking_metric()
        self._check_schedules()
        self._check_generator_nodes()
        if self.reward_penalties.any_enabled and not self.env.should_use_nemo_gym:
            raise RuleError(
                "reward_penalties",
                "penalties apply to gym results only: set env.should_use_nemo_gym: true or switch them off",
            )
        if self.reward_penalties.penalize_invalid_tool_call and not self.env.gym.invalid_tool_call_patterns:
            raise RuleError(
                "reward_penalties.penalize_invalid_tool_call",
                "needs env.gym.invalid_tool_call_patterns (what unexecuted tool-call markup looks like)",
            )
        if self.loss_fn.force_on_policy_ratio:
            step_batch = self.ppo.num_prompts_per_step * self.ppo.num_generations_per_prompt
            global_batch = self.model.train_global_batch_size
            if global_batch is not None and global_batch != step_batch:
                raise RuleError(
                    "loss_fn.force_on_policy_ratio",
                    f"needs one optimizer step per PPO pass: model.train_global_batch_size={global_batch} must be "
                    f"null or ppo.num_prompts_per_step * ppo.num_generations_per_prompt = {step_batch}",
                )
        if self.generation.max_new_tokens >= self.model.max_total_sequence_length:
            raise RuleError(
                "generation.max_new_tokens",
                f"{self.generation.max_new_tokens} leaves no room for the prompt within "
                f"model.max_total_sequence_length={self.model.max_total_sequence_length}",
            )
        return self

    @model_validator(mode="wrap")
    @classmethod
    def _drop_unused_critic(cls, data: Any, handler: ModelWrapValidatorHandler[Self], info: ValidationInfo) -> Self:
        """raw_reward trains no critic, so a `value` section is dropped (with a note) and no value worker is built.

        Configs switch estimators by one override and keep their critic section, so it is not an error. The
        section is validated first: its typos and rules (e.g. an enabled privileged critic) are still reported.
        Defined after `_check_cross_section_rules` so that it wraps it: the rules see the section it drops.
        """
        config = handler(data)
        if config.value is None or config.ppo.adv_estimator.uses_critic:
            return config
        add_note(
            info,
            f"value: ignored (section dropped): ppo.adv_estimator.name={config.ppo.adv_estimator.name!r} "
            "trains no critic",
        )
        return config.model_copy(update={"value": None})

    def _check_generator_nodes(self) -> None:
        # NeMo-RL's rule: generators on whole nodes of their own, as large as the trainers' nodes.
        resources = self.generation.colocated.resources
        if resources.num_nodes is None:
            return
        cluster = self.cluster
        if resources.num_nodes >= cluster.num_nodes:
            raise RuleError(
                "generation.colocated.resources.num_nodes",
                f"{resources.num_nodes} whole nodes for generators leave none of cluster.num_nodes={cluster.num_nodes} "
                "for the trainers; raise cluster.num_nodes or lower this",
            )
        if cluster.gpus_per_node and resources.gpus_per_node != cluster.gpus_per_node:
            raise RuleError(
                "generation.colocated.resources.gpus_per_node",
                f"{resources.gpus_per_node} must equal cluster.gpus_per_node={cluster.gpus_per_node}: generators take "
                "whole nodes",
            )

    def _check_gym(self) -> None:
        if not self.env.should_use_nemo_gym:
            return
        if self.generation.top_k != 0:
            raise RuleError(
                "generation.top_k",
                f"must be 0 with env.should_use_nemo_gym (got {self.generation.top_k}): gym agents sample through the "
                "policy server, which serves (temperature, top_p) profiles only",
            )
        if self.generation.stop_token_ids:
            raise RuleError(
                "generation.stop_token_ids",
                "must be null with env.should_use_nemo_gym: gym rollouts stop on the chat template's end-of-turn "
                "token, and agents never send stop sequences",
            )
        if self.ppo.provided("max_failed_groups_per_step"):
            raise RuleError(
                "ppo.max_failed_groups_per_step",
                "applies to reward-function runs only: with env.should_use_nemo_gym the failure budget is "
                "env.gym.max_failed_groups_per_step; set that instead",
            )
        if self.data.max_new_tokens_key is not None:
            raise RuleError(
                "data.max_new_tokens_key",
                "must be null with env.should_use_nemo_gym: per-row response budgets apply to reward-function "
                "rollouts only (gym agents ask the policy server for their own max_output_tokens)",
            )

    def _check_critic(self) -> None:
        estimator = self.ppo.adv_estimator
        if estimator.uses_critic and self.value is None:
            raise RuleError("value", f"required: ppo.adv_estimator.name={estimator.name!r} trains a critic")
        if not estimator.uses_critic and self.value is not None and self.value.privileged_critic.enabled:
            raise RuleError(
                "value.privileged_critic.enabled",
                f"needs a critic, but ppo.adv_estimator.name={estimator.name!r} trains none",
            )
        if self.value is not None and self.value.max_total_sequence_length < self.model.max_total_sequence_length:
            # The critic scores the policy's sequences whole; a shorter bound could only truncate them silently.
            raise RuleError(
                "value.max_total_sequence_length",
                f"{self.value.max_total_sequence_length} is shorter than model.max_total_sequence_length="
                f"{self.model.max_total_sequence_length}: the critic scores the policy's whole sequences (use at "
                "least the policy's length)",
            )
        weight = self.value_loss_fn.homogeneous_group_weight
        if weight != 1.0 and not estimator.residual_baseline:
            raise RuleError(
                "value_loss_fn.homogeneous_group_weight",
                f"{weight} needs ppo.adv_estimator.residual_baseline: true (homogeneous groups are defined by it)",
            )

    def _trained_schedules(self) -> list[tuple[str, TrainedModelConfig, str, int]]:
        """(section key, section, epochs key, epochs) of each trained model: the policy, and the critic if any."""
        trained: list[tuple[str, TrainedModelConfig, str, int]] = [
            ("model", self.model, "ppo.ppo_epochs", self.ppo.ppo_epochs)
        ]
        if self.value is not None and self.ppo.adv_estimator.uses_critic:
            trained.append(("value", self.value, "ppo.critic_ppo_epochs", self.ppo.resolved_critic_ppo_epochs))
        return trained

    def _check_schedules(self) -> None:
        """A decaying schedule of explicit length must fit its warmup; the workers would refuse it only once Ray has
        started. (A derived length shorter than the warmup is fitted instead: `_fit_warmup_to_the_run`.)"""
        for key, section, _, _ in self._trained_schedules():
            scheduler = section.scheduler
            total = scheduler.total_steps
            if scheduler.name != "constant" and total is not None and total < scheduler.warmup_steps:
                raise RuleError(
                    f"{key}.scheduler.warmup_steps",
                    f"{scheduler.warmup_steps} is longer than {key}.scheduler.total_steps={total}; expected at most "
                    f"{total}",
                )

    @model_validator(mode="wrap")
    @classmethod
    def _fit_warmup_to_the_run(cls, data: Any, handler: ModelWrapValidatorHandler[Self], info: ValidationInfo) -> Self:
        """A decaying schedule whose length is derived (no scheduler.total_steps) and shorter than its warmup warms
        up over the whole run instead, with a note naming both keys: shortening a run (`ppo.max_num_steps=2`) must
        not need a warmup edit. Defined after `_drop_unused_critic` so that it wraps it (a dropped critic is not
        fitted)."""
        config = handler(data)
        updates: dict[str, Any] = {}
        for key, section, passes_key, passes in config._trained_schedules():
            scheduler = section.scheduler
            if scheduler.name == "constant" or scheduler.total_steps is not None:
                continue
            per_pass = config.optimizer_steps_per_pass(section)
            total = config.ppo.max_num_steps * passes * per_pass
            if scheduler.warmup_steps <= total:
                continue
            add_note(
                info,
                f"{key}.scheduler.warmup_steps: {scheduler.warmup_steps} clamped to {total}, the run's optimizer steps "
                f"(ppo.max_num_steps={config.ppo.max_num_steps} x {passes_key}={passes} x {per_pass} per pass): the "
                f"learning rate warms up over the whole run (set {key}.scheduler.total_steps to keep the schedule)",
            )
            fitted = scheduler.model_copy(update={"warmup_steps": total})
            updates[key] = section.model_copy(update={"scheduler": fitted})
        return config.model_copy(update=updates) if updates else config

    def optimizer_steps_per_pass(self, section: TrainedModelConfig) -> int:
        """Optimizer steps of one pass over a step's batch: ceil(step batch / section.train_global_batch_size)."""
        step_batch = self.ppo.num_prompts_per_step * self.ppo.num_generations_per_prompt
        return -(-step_batch // (section.train_global_batch_size or step_batch))

    def _check_ranking_metric(self) -> None:
        """keep_top_k by a val: metric needs validations to rank by; without them it silently keeps the newest."""
        metric = self.checkpointing.metric_name
        if self.checkpointing.keep_top_k is None or metric is None or not metric.startswith("val:"):
            return
        if not self.data.has_validation_source and self.data.validation_fraction == 0:
            raise RuleError(
                "checkpointing.metric_name",
                f"{metric!r} is never logged: the run has no validation rows (set data.validation_path or "
                "data.validation_fraction > 0, or rank by a train: metric)",
            )
        if self.ppo.val_period == 0:
            raise RuleError(
                "checkpointing.metric_name",
                f"{metric!r} ranks checkpoints by validation, but ppo.val_period=0 never validates during the run "
                "(set ppo.val_period: checkpoints saved at a validation are ranked, the others pruned first; or rank "
                "by a train: metric)",
            )

    def _check_async(self) -> None:
        if not self.ppo.async_ppo.enabled:
            return
        if not self.loss_fn.use_importance_sampling_correction:
            raise RuleError(
                "loss_fn.use_importance_sampling_correction",
                "must be true when ppo.async_ppo.enabled is true: async rollouts come from older weights",
            )
        if self.generation.colocated.enabled:
            raise RuleError(
                "generation.colocated.enabled",
                "must be false when ppo.async_ppo.enabled is true: async generation runs on separate workers",
            )

    def _check_kl(self) -> None:
        beta = self.loss_fn.reference_policy_kl_penalty
        if beta > 0 and self.ppo.skip_reference_policy_logprobs_calculation:
            raise RuleError(
                "ppo.skip_reference_policy_logprobs_calculation",
                f"must be false when loss_fn.reference_policy_kl_penalty={beta} > 0 (the KL needs reference logprobs)",
            )

    @property
    def value_model_name(self) -> str:
        """The critic's initial weights: value.model_name, or the policy's model when null."""
        if self.value is not None and self.value.model_name is not None:
            return self.value.model_name
        return self.model.model_name
