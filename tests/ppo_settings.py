"""PPO settings that tests write by hand: advantage-estimator sections with every key the schema requires (as a
config tree holds them, and validated) and `StepSettings` for steps run without a config file.

The schema requires each estimator key to be written, even when null, so every test that builds a section spelled
out the same eight lines; here they are written once, and each caller names only the values its expected numbers
depend on. `tiny_run_tree` is the smallest valid single-turn run config, which tests vary one input of.
"""

from typing import Any

from asyncppo.config.losses import PolicyLossConfig
from asyncppo.config.ppo import AdvEstimatorConfig
from asyncppo.trainer.ppo_step import StepSettings


def gae_section(**overrides: Any) -> dict[str, Any]:
    """A gae section as a config tree holds it: gamma = lambda = 1 (every return is the terminal reward), no split
    lambdas, no length-adaptive lambda, no residual baseline, no whitening."""
    section: dict[str, Any] = {
        "name": "gae",
        "gae_gamma": 1.0,
        "gae_lambda": 1.0,
        "gae_lambda_value": None,
        "gae_lambda_policy": None,
        "length_adaptive_alpha": 0.0,
        "normalize_advantages": False,
        "residual_baseline": False,
    }
    return section | overrides


def turn_gae_section(**overrides: Any) -> dict[str, Any]:
    """A turn_gae section as a config tree holds it: gamma and both lambdas 1, no residual baseline, no whitening."""
    section: dict[str, Any] = {
        "name": "turn_gae",
        "turn_gae_gamma": 1.0,
        "turn_gae_lambda_value": 1.0,
        "turn_gae_lambda_policy": 1.0,
        "normalize_advantages": False,
        "residual_baseline": False,
    }
    return section | overrides


def gae(**overrides: Any) -> AdvEstimatorConfig:
    """`gae_section(**overrides)`, validated."""
    return AdvEstimatorConfig(**gae_section(**overrides))


def turn_gae(**overrides: Any) -> AdvEstimatorConfig:
    """`turn_gae_section(**overrides)`, validated."""
    return AdvEstimatorConfig(**turn_gae_section(**overrides))


def plain_step_settings(advantage: AdvEstimatorConfig, **overrides: Any) -> StepSettings:
    """Step settings with nothing on but `advantage`: one policy and one critic epoch, the policy trained from step 0,
    default policy loss, no post-update critic metrics, no mismatch or overlong filtering, no reference policy."""
    fields: dict[str, Any] = {
        "policy_loss": PolicyLossConfig(),
        "ppo_epochs": 1,
        "critic_ppo_epochs": 1,
        "policy_training_start_step": 0,
        "log_post_update_critic_metrics": False,
        "homogeneous_group_weight": 1.0,
        "seq_logprob_error_threshold": None,
        "overlong_filtering": False,
        "need_reference_logprobs": False,
    }
    return StepSettings(advantage=advantage, **(fields | overrides))


def tiny_run_tree(train_path: str, reward_function: str = "exact_match") -> dict[str, Any]:
    """A small valid single-turn run on the tiny model on CPU: 2 steps of 2 prompts x 2 samples, GAE with a critic.
    Callers add what their test needs (validation, checkpointing, logging) to the returned tree."""
    return {
        "model": {"model_name": "tiny:tiny", "train_micro_batch_size": 4, "max_total_sequence_length": 64},
        "value": {"train_micro_batch_size": 4, "max_total_sequence_length": 64},
        "data": {"train_path": train_path},
        "generation": {"max_new_tokens": 4},
        "env": {"reward_function": reward_function},
        "ppo": {
            "num_prompts_per_step": 2,
            "num_generations_per_prompt": 2,
            "max_num_steps": 2,
            "ppo_epochs": 1,
            "adv_estimator": gae_section(normalize_advantages=True),
        },
        "cluster": {"device": "cpu"},
    }
