"""Config sections of the PPO algorithm: `ppo` with its `adv_estimator` and `async_ppo` blocks.

Keys follow NeMo-RL's names so its configs port over. The estimator keys it reads without a
default stay required here, as NeMo-RL requires them: a run never silently picks a lambda or a baseline.
"""

from dataclasses import dataclass
from typing import Annotated, Literal, Self

from pydantic import Field, NonNegativeInt, PositiveInt, model_validator

from asyncppo.config.base import RuleError, Section

EstimatorName = Literal["gae", "turn_gae", "raw_reward"]


@dataclass(frozen=True)
class RequiredFor:
    """Field marker: the estimators that read this key without a default, so a config must write it (a missing
    key is reported with its full path); `null_allowed` keys may be written as null."""

    estimators: tuple[EstimatorName, ...]
    null_allowed: bool = False


_GAE = RequiredFor(("gae",))
_TURN_GAE = RequiredFor(("turn_gae",))
_GAE_MAY_BE_NULL = RequiredFor(("gae",), null_allowed=True)


class AdvEstimatorConfig(Section):
    """How advantages and critic targets are computed."""

    name: EstimatorName
    """`gae` (token-level GAE), `turn_gae` (one step per assistant turn) or `raw_reward` (GRPO-style, no critic)."""
    gae_gamma: Annotated[float | None, _GAE] = Field(default=None, ge=0, le=1)
    """Discount per token (gae)."""
    gae_lambda: Annotated[float | None, _GAE] = Field(default=None, ge=0, le=1)
    """GAE lambda used for both advantages and returns unless decoupled (gae)."""
    gae_lambda_value: Annotated[float | None, _GAE_MAY_BE_NULL] = Field(default=None, ge=0, le=1)
    """Lambda for the critic's returns; null = gae_lambda (gae; the key is required, null allowed)."""
    gae_lambda_policy: Annotated[float | None, _GAE_MAY_BE_NULL] = Field(default=None, ge=0, le=1)
    """Lambda for the policy's advantages; null = gae_lambda (gae; the key is required, null allowed)."""
    # Null is rejected with its own hint (use 0.0) by the validator, so the marker lets it through.
    length_adaptive_alpha: Annotated[float | None, _GAE_MAY_BE_NULL] = Field(default=None, ge=0)
    """alpha > 0 sets lambda_policy = clamp(1 - 1/(alpha * L), 0, 1) per sample of L response tokens; 0 disables."""
    normalize_advantages: Annotated[bool | None, RequiredFor(("gae", "turn_gae", "raw_reward"))] = None
    """Whiten advantages over valid response tokens (masked mean, unbiased variance)."""
    residual_baseline: Annotated[bool | None, RequiredFor(("gae", "turn_gae"))] = None
    """Leave-one-out group baseline B with the critic learning the residual C = V - B (gae and turn_gae)."""
    turn_gae_gamma: Annotated[float | None, _TURN_GAE] = Field(default=None, ge=0, le=1)
    """Discount per assistant turn (turn_gae)."""
    turn_gae_lambda_value: Annotated[float | None, _TURN_GAE] = Field(default=None, ge=0, le=1)
    """Turn-level lambda for the critic's returns (turn_gae)."""
    turn_gae_lambda_policy: Annotated[float | None, _TURN_GAE] = Field(default=None, ge=0, le=1)
    """Turn-level lambda for the policy's advantages (turn_gae)."""
    raw_reward_baseline: Literal["none", "mean", "leave_one_out"] = "none"
    """raw_reward: subtract nothing, the group mean, or the leave-one-out group mean from each reward."""
    raw_reward_normalize_std: bool = False
    """raw_reward: divide the baselined reward by the group's reward standard deviation."""

    @model_validator(mode="after")
    def _check_required_for_estimator(self) -> Self:
        required = self._required_keys()
        for key, _ in required:
            if not self.provided(key):
                raise RuleError(key, f"required when name={self.name!r} (missing)")
        for key, marker in required:
            if not marker.null_allowed and getattr(self, key) is None:
                raise RuleError(key, f"may not be null when name={self.name!r}")
        if self.name == "gae" and self.length_adaptive_alpha is None:
            raise RuleError("length_adaptive_alpha", "may not be null: use 0.0 to disable length-adaptive lambda")
        if self.name == "raw_reward" and self.residual_baseline:
            raise RuleError("residual_baseline", "must be false or absent when name='raw_reward' (it has no critic)")
        if self.name == "raw_reward" and self.raw_reward_normalize_std and self.raw_reward_baseline == "none":
            raise RuleError(
                "raw_reward_normalize_std",
                "true needs raw_reward_baseline 'mean' or 'leave_one_out' (got 'none'): the group std scales "
                "rewards centred on a baseline",
            )
        return self

    def _required_keys(self) -> list[tuple[str, RequiredFor]]:
        """(key, marker) of every field the configured estimator requires, in declaration order."""
        return [
            (key, marker)
            for key, field in type(self).model_fields.items()
            for marker in field.metadata
            if isinstance(marker, RequiredFor) and self.name in marker.estimators
        ]

    @property
    def gamma(self) -> float:
        """The discount of the configured estimator (1.0 for raw_reward, which does not discount)."""
        if self.name == "gae":
            assert self.gae_gamma is not None
            return self.gae_gamma
        if self.name == "turn_gae":
            assert self.turn_gae_gamma is not None
            return self.turn_gae_gamma
        return 1.0

    @property
    def uses_critic(self) -> bool:
        """raw_reward trains no value model; every other estimator does."""
        return self.name != "raw_reward"


class AsyncPPOConfig(Section):
    """Asynchronous PPO: generation runs ahead of training on separate workers, bounded by a staleness window."""

    enabled: bool = False
    """Run the async loop (collector + trajectory buffer) instead of generating each batch on demand."""
    max_trajectory_age_steps: PositiveInt = 1
    """Staleness window: a trajectory generated with weights of step g trains at a step in g+1..g+age."""
    warmup_max_trajectory_age_steps: PositiveInt | None = None
    """Collector lead age while the policy is frozen (critic warm-up); null = max_trajectory_age_steps."""
    in_flight_weight_updates: bool = False
    """Push new weights while rollouts are running (a trajectory may span versions) instead of draining first."""
    recompute_kv_cache_after_weight_updates: bool = False
    """With in-flight weight updates on the graph backend: after new weights, running rows recompute the KV of
    their prompt and tokens so far before continuing (otherwise they continue on the KV of the old weights).
    Cached prefixes are dropped on every update either way. The hf backend never runs a row across an update."""
    drop_incomplete_targets_on_restore: bool = True
    """On resume, regenerate partially collected target steps from scratch (true) instead of gap-filling them,
    which would bias the batch toward short, fast rollouts."""
    watchdog_timeout_s: float = Field(default=600.0, gt=0)
    """Fail the run when the trajectory buffer makes no progress for this many seconds."""
    log_every: NonNegativeInt | None = 50
    """Print the prompt accounting (drawn, trained, dropped by reason, buffered, pending; any imbalance) every N
    steps; 0 never, null every step. Each checkpoint also writes it in full to accounting.json."""


class RewardShapingConfig(Section):
    """DAPO overlong shaping of the reward, applied before advantages."""

    enabled: bool = False
    """Apply the overlong penalty (or the stop-properly penalty)."""
    overlong_buffer_length: PositiveInt | None = None
    """Length of the soft-penalty zone before max_response_length, in tokens."""
    overlong_buffer_penalty: float = Field(default=1.0, ge=0)
    """Penalty reached at max_response_length."""
    max_response_length: PositiveInt | None = None
    """Response length at which the full penalty applies."""
    stop_properly_penalty_coef: float | None = None
    """If set, truncated samples get reward * coef instead of the overlong penalty."""

    @model_validator(mode="after")
    def _check_lengths(self) -> Self:
        if self.enabled and self.stop_properly_penalty_coef is None:
            for key in ("overlong_buffer_length", "max_response_length"):
                if getattr(self, key) is None:
                    raise RuleError(key, "required when enabled=true and stop_properly_penalty_coef is null")
        return self


class RewardScalingConfig(Section):
    """Linear rescaling of rewards: clamp to [source_min, source_max], map to [target_min, target_max]."""

    enabled: bool = False
    """Apply the rescaling."""
    source_min: float = 0.0
    """Lower clamp of the raw reward."""
    source_max: float = 1.0
    """Upper clamp of the raw reward."""
    target_min: float = 0.0
    """Value the source minimum maps to."""
    target_max: float = 1.0
    """Value the source maximum maps to."""

    @model_validator(mode="after")
    def _check_range(self) -> Self:
        if self.source_max <= self.source_min:
            raise RuleError("source_max", f"{self.source_max} must be greater than source_min={self.source_min}")
        return self


class PPOConfig(Section):
    """The PPO loop: batch sizes, epochs, validation cadence, reward processing, estimator, async mode."""

    num_prompts_per_step: PositiveInt
    """Prompts per training step (= prompt groups per step)."""
    num_generations_per_prompt: PositiveInt
    """Rollouts per prompt (the group size G)."""
    max_num_steps: PositiveInt
    """Training steps of the run."""
    max_num_epochs: PositiveInt | None = None
    """Passes over the training data (sync runs); null = bounded by max_num_steps only."""
    max_rollout_turns: PositiveInt = 1
    """Turn cap for built-in multi-turn environments (gym agents bound their own turns)."""
    ppo_epochs: int = Field(default=..., ge=1)
    """Policy passes over each step's batch (>= 1)."""
    critic_ppo_epochs: PositiveInt | None = None
    """Critic passes per step (>= ppo_epochs; the surplus runs before the shared loop); null = ppo_epochs."""
    log_post_update_critic_metrics: bool = False
    """Re-score the batch with the updated critic for critic/explained_var_post_update and critic/loss_post_update."""
    policy_training_start_step: NonNegativeInt = 0
    """Critic-only warm-up: the policy first trains at this step."""
    val_period: NonNegativeInt = 0
    """Validate every N steps; 0 = never periodically."""
    val_at_start: bool = False
    """Validate before the first step."""
    val_at_end: bool = True
    """Validate after the last step."""
    max_val_samples: PositiveInt | None = None
    """Validation prompts per validation; null = the whole validation set."""
    val_num_generations_per_prompt: PositiveInt = 1
    """Samples per validation prompt; more samples make a sampled validation reward less noisy."""
    seed: int = Field(default=42, ge=0, le=2**63 - 1)
    """Seed of every random number generator of the run."""
    max_failed_groups_per_step: NonNegativeInt = 0
    """Runs without the gym: prompt groups whose reward function may fail (raise, return a value that is not a finite
    number, or run past env.reward_timeout_s) while one step's batch is filled, and per validation; each is dropped
    and replaced. One more stops the run with one line naming the function; 0 = the first failure stops it. Gym runs:
    env.gym.max_failed_groups_per_step."""
    use_dynamic_sampling: bool = False
    """DAPO dynamic sampling (sync runs): keep only groups whose rewards differ; more batches fill the step."""
    dynamic_sampling_max_gen_batches: PositiveInt = 10
    """Generation batches one step may draw under dynamic sampling before the run stops with an error."""
    batch_multiplier: PositiveInt = 1
    """Prompts drawn per generation batch, in multiples of num_prompts_per_step (dynamic sampling only; else 1)."""
    overlong_filtering: bool = False
    """Zero the loss weight of truncated samples (they still count for baselines)."""
    skip_reference_policy_logprobs_calculation: bool = True
    """Skip the frozen reference policy forward; requires loss_fn.reference_policy_kl_penalty == 0."""
    seq_logprob_error_threshold: float | None = Field(default=None, gt=0)
    """Mask sequences whose mean exp(|gen - train| logprob) exceeds this; null disables."""
    log_rollout_dump: bool = False
    """Write per-token rollout dumps (values, advantages, logprobs) to the run directory."""
    rollout_dump_period: PositiveInt | None = None
    """Dump every N steps; required when log_rollout_dump is true."""
    reward_shaping: RewardShapingConfig = RewardShapingConfig()
    """Overlong reward shaping."""
    reward_scaling: RewardScalingConfig = RewardScalingConfig()
    """Linear reward rescaling."""
    invalid_tool_call_advantage: float | None = None
    """GRPO-only advantage overwrite; rejected for PPO (it would break A = G - V). Must be null."""
    malformed_thinking_advantage: float | None = None
    """GRPO-only advantage overwrite; rejected for PPO (it would break A = G - V). Must be null."""
    adv_estimator: AdvEstimatorConfig
    """Advantage estimator."""
    async_ppo: AsyncPPOConfig = AsyncPPOConfig()
    """Asynchronous collection."""

    @model_validator(mode="after")
    def _check_ppo_rules(self) -> Self:
        if self.critic_ppo_epochs is not None and self.critic_ppo_epochs < self.ppo_epochs:
            raise RuleError(
                "critic_ppo_epochs",
                f"{self.critic_ppo_epochs} must be >= ppo_epochs={self.ppo_epochs} "
                "(the critic runs every shared pass plus the surplus)",
            )
        for key in ("invalid_tool_call_advantage", "malformed_thinking_advantage"):
            if getattr(self, key) is not None:
                raise RuleError(
                    key,
                    "overwrites advantages per message, which breaks PPO's A = G - V consistency; "
                    "not supported for PPO: remove it (reward_penalties zero rewards instead)",
                )
        if self.batch_multiplier != 1 and not self.use_dynamic_sampling:
            raise RuleError(
                "batch_multiplier",
                f"{self.batch_multiplier} draws extra prompts only for dynamic sampling: set it to 1 or "
                "use_dynamic_sampling: true",
            )
        if self.use_dynamic_sampling and self.async_ppo.enabled:
            raise RuleError(
                "use_dynamic_sampling",
                "is for synchronous runs (the async collector cannot hold back a step for refills): "
                "set it to false or async_ppo.enabled: false",
            )
        if self.use_dynamic_sampling and self.num_generations_per_prompt < 2:
            raise RuleError(
                "use_dynamic_sampling",
                f"keeps only groups whose rewards differ, which needs num_generations_per_prompt >= 2 (got "
                f"{self.num_generations_per_prompt}): raise it or set use_dynamic_sampling: false",
            )
        if self.log_rollout_dump and self.rollout_dump_period is None:
            raise RuleError("rollout_dump_period", "required when log_rollout_dump is true")
        estimator = self.adv_estimator
        if not estimator.uses_critic and self.policy_training_start_step > 0:
            raise RuleError(
                "policy_training_start_step",
                f"{self.policy_training_start_step} asks for a critic-only warm-up, but adv_estimator.name="
                f"{estimator.name!r} trains no critic (those steps would train nothing): set it to 0",
            )
        if estimator.residual_baseline:
            if abs(estimator.gamma - 1.0) > 1e-8:
                key = "gae_gamma" if estimator.name == "gae" else "turn_gae_gamma"
                raise RuleError(
                    f"adv_estimator.{key}",
                    f"must be 1 when residual_baseline is true (got {estimator.gamma}): the group baseline "
                    "only cancels out of the TD errors without discounting",
                )
            if self.num_generations_per_prompt < 2:
                raise RuleError(
                    "num_generations_per_prompt",
                    f"must be >= 2 when adv_estimator.residual_baseline is true (got "
                    f"{self.num_generations_per_prompt}): with one rollout per prompt the leave-one-out baseline "
                    "equals the reward and it vanishes",
                )
        return self

    @property
    def resolved_critic_ppo_epochs(self) -> int:
        """Critic passes per step: critic_ppo_epochs, or ppo_epochs when null."""
        return self.critic_ppo_epochs if self.critic_ppo_epochs is not None else self.ppo_epochs
