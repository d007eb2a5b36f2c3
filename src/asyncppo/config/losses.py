"""Config sections of the two losses: `loss_fn` (clipped policy loss) and `value_loss_fn` (clipped value MSE)."""

from typing import Literal, Self

from pydantic import Field, model_validator

from asyncppo.config.base import RuleError, Section

KLType = Literal["k1", "k2", "k3"]


class PolicyLossConfig(Section):
    """Clipped PPO policy loss with importance-sampling correction and optional KL terms."""

    ratio_clip_min: float = Field(default=0.2, ge=0, le=1)
    """Lower clip: the ratio is clipped at 1 - ratio_clip_min; at most 1 (1 = no lower clip, as NeMo-RL's CISPO
    recipe sets it; above 1 the bound would be negative, below any ratio)."""
    ratio_clip_max: float = Field(default=0.2, ge=0)
    """Upper clip: the ratio is clipped at 1 + ratio_clip_max (DAPO clip-higher when > ratio_clip_min)."""
    ratio_clip_c: float | None = Field(default=None, gt=1)
    """Dual clip constant c > 1: for negative advantages the loss is at most -A * c; null disables."""
    disable_ppo_ratio: bool = False
    """Use the plain policy gradient -A * logpi (REINFORCE-like) instead of the clipped ratio."""
    token_level_loss: bool = True
    """Average over all valid tokens of the global batch (true) or per sequence first (false)."""
    sequence_level_importance_ratios: bool = False
    """GSPO: one ratio per sequence, exp(mean token log-ratio); needs token_level_loss false."""
    reference_policy_kl_penalty: float = Field(default=0.0, ge=0)
    """beta of the KL(pi || pi_ref) term (in the loss, or in the reward with use_kl_in_reward)."""
    reference_policy_kl_type: KLType = "k3"
    """Estimator of the reference KL."""
    kl_input_clamp_value: float | None = Field(default=20.0, gt=0)
    """Clamp of the log-ratio fed to the KL estimator; null disables."""
    kl_output_clamp_value: float | None = Field(default=10.0, gt=0)
    """Clamp of the per-token KL estimate; null disables."""
    use_kl_in_reward: bool = False
    """Subtract beta * KL from the per-token reward (GAE) instead of adding it to the loss."""
    behaviour_kl_penalty: float = Field(default=0.0, ge=0)
    """Weight of KL(pi_gen || pi_theta) on rollout tokens; bounds drift across async steps."""
    behaviour_kl_type: KLType = "k3"
    """Estimator of the behaviour KL."""
    behaviour_kl_input_clamp_value: float | None = Field(default=20.0, gt=0)
    """Clamp of the behaviour KL log-ratio; null disables."""
    behaviour_kl_output_clamp_value: float | None = Field(default=10.0, gt=0)
    """Clamp of the per-token behaviour KL; null disables."""
    use_importance_sampling_correction: bool = False
    """Weight each token by exp(old - gen) to correct for the generator's distribution (required for async)."""
    truncated_importance_sampling_type: Literal["tis", "icepop", "seq-mask-tis"] | None = None
    """Truncation of the IS weights: clamp (tis), zero out-of-range tokens (icepop), or drop whole sequences."""
    truncated_importance_sampling_ratio: float | None = Field(default=None, gt=0)
    """Upper bound of the IS weight for truncation."""
    truncated_importance_sampling_ratio_min: float | None = Field(default=None, ge=0)
    """Lower bound of the IS weight (icepop, seq-mask-tis; tis clamps at this or 0)."""
    use_on_policy_kl_approximation: bool = False
    """Weight the reference KL by exp(curr - gen) so it estimates the KL under the current policy."""
    force_on_policy_ratio: bool = False
    """Force the ratio to 1 (with gradient); needs one optimizer step per PPO step."""
    use_cispo: bool = False
    """CISPO: loss -sg(clip(r)) * A * logpi, so clipped tokens keep a (clipped-weight) gradient; no dual clip."""
    positive_example_nll_weight: float = Field(default=0.0, ge=0)
    """VAPO: weight of an NLL term on the tokens of samples with positive reward."""

    @model_validator(mode="after")
    def _check_loss_rules(self) -> Self:
        if self.use_cispo:
            self._check_cispo_combinations()
        if self.sequence_level_importance_ratios and self.token_level_loss:
            raise RuleError("sequence_level_importance_ratios", "needs token_level_loss: false")
        if self.truncated_importance_sampling_type is not None:
            if not self.use_importance_sampling_correction:
                raise RuleError("truncated_importance_sampling_type", "needs use_importance_sampling_correction: true")
            if self.truncated_importance_sampling_ratio is None:
                raise RuleError(
                    "truncated_importance_sampling_ratio",
                    f"required when truncated_importance_sampling_type={self.truncated_importance_sampling_type!r}",
                )
            self._check_truncation_bounds(
                self.truncated_importance_sampling_type, self.truncated_importance_sampling_ratio
            )
        return self

    def _check_cispo_combinations(self) -> None:
        """CISPO replaces the clipped surrogate: options that redefine or bound that surrogate contradict it."""
        if self.disable_ppo_ratio:
            raise RuleError(
                "use_cispo",
                "true contradicts disable_ppo_ratio: true (CISPO weights the gradient by the clipped ratio, "
                "disable_ppo_ratio drops the ratio): keep one of them",
            )
        if self.force_on_policy_ratio:
            raise RuleError(
                "use_cispo",
                "true contradicts force_on_policy_ratio: true (a ratio forced to 1 leaves CISPO a plain policy "
                "gradient): keep one of them",
            )
        if self.ratio_clip_c is not None:
            raise RuleError(
                "ratio_clip_c",
                f"{self.ratio_clip_c} bounds the PPO surrogate, which use_cispo replaces (CISPO's weight is "
                "already clipped to [1 - ratio_clip_min, 1 + ratio_clip_max]): set it to null or use_cispo: false",
            )

    def _check_truncation_bounds(self, kind: str, high: float) -> None:
        low = self.truncated_importance_sampling_ratio_min
        if low is None and kind != "tis":
            raise RuleError(
                "truncated_importance_sampling_ratio_min", f"required when truncated_importance_sampling_type={kind!r}"
            )
        if low is not None and low > high:
            raise RuleError(
                "truncated_importance_sampling_ratio_min",
                f"{low} must lie in [0, truncated_importance_sampling_ratio={high}]",
            )

    @property
    def uses_reference_kl(self) -> bool:
        """The loss carries the reference KL term (it moves into the reward when use_kl_in_reward)."""
        return not self.use_kl_in_reward and self.reference_policy_kl_penalty > 0

    @property
    def uses_kl_in_reward(self) -> bool:
        """The reference KL term moves into the per-token reward (use_kl_in_reward with a positive beta)."""
        return self.use_kl_in_reward and self.reference_policy_kl_penalty > 0


class ValueLossConfig(Section):
    """Clipped MSE value loss."""

    scale: float = Field(default=1.0, gt=0)
    """Multiplier of the value loss."""
    cliprange: float | None = Field(default=None, gt=0)
    """Clip the new value to old +- cliprange (PPO value clipping); null disables."""
    homogeneous_group_weight: float = Field(default=1.0, ge=0)
    """Loss weight of groups whose rollouts all got the same reward (needs the residual baseline when != 1)."""
