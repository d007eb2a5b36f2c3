"""Every load-time rule of the config (NeMo-RL's PPO rules and ours): a rejecting case each, and a valid config."""

import pytest
from rejections import rejected

from asyncppo.config import ConfigError, validate_tree
from asyncppo.config.runtime import RANKING_METRICS


def test_minimal_config_is_valid_and_fills_schema_defaults(tree):
    config = validate_tree(tree)
    assert config.ppo.resolved_critic_ppo_epochs == 1
    assert config.generation.top_k == 0
    assert config.ppo.async_ppo.drop_incomplete_targets_on_restore is True
    assert config.value_model_name == "tiny:tiny"


def test_ppo_epochs_must_be_at_least_one(tree):
    tree["ppo"]["ppo_epochs"] = 0
    assert rejected(tree).startswith("ppo.ppo_epochs: Input should be greater than or equal to 1")


def test_critic_epochs_may_not_be_fewer_than_policy_epochs(tree):
    tree["ppo"]["ppo_epochs"] = 3
    tree["ppo"]["critic_ppo_epochs"] = 2
    assert rejected(tree).startswith("ppo.critic_ppo_epochs: 2 must be >= ppo_epochs=3")
    tree["ppo"]["critic_ppo_epochs"] = 5
    assert validate_tree(tree).ppo.resolved_critic_ppo_epochs == 5


def test_residual_baseline_needs_gamma_one(tree):
    tree["ppo"]["adv_estimator"].update(residual_baseline=True, gae_gamma=0.99)
    assert rejected(tree).startswith("ppo.adv_estimator.gae_gamma: must be 1 when residual_baseline is true")
    tree["ppo"]["adv_estimator"]["gae_gamma"] = 1.0 - 1e-9  # within the tolerance of 1e-8
    assert validate_tree(tree).ppo.adv_estimator.residual_baseline


def test_residual_turn_gae_needs_turn_gamma_one(tree):
    tree["ppo"]["adv_estimator"] = {
        "name": "turn_gae",
        "turn_gae_gamma": 0.9,
        "turn_gae_lambda_value": 1.0,
        "turn_gae_lambda_policy": 0.95,
        "normalize_advantages": True,
        "residual_baseline": True,
    }
    assert rejected(tree).startswith("ppo.adv_estimator.turn_gae_gamma: must be 1")


def test_residual_baseline_needs_two_generations_per_prompt(tree):
    tree["ppo"]["adv_estimator"]["residual_baseline"] = True
    tree["ppo"]["num_generations_per_prompt"] = 1
    assert rejected(tree).startswith("ppo.num_generations_per_prompt: must be >= 2")


def test_homogeneous_group_weight_needs_the_residual_baseline(tree):
    tree["value_loss_fn"] = {"homogeneous_group_weight": 0.5}
    assert rejected(tree).startswith("value_loss_fn.homogeneous_group_weight: 0.5 needs")
    tree["ppo"]["adv_estimator"]["residual_baseline"] = True
    assert validate_tree(tree).value_loss_fn.homogeneous_group_weight == 0.5


def test_homogeneous_group_weight_may_not_be_negative(tree):
    tree["value_loss_fn"] = {"homogeneous_group_weight": -0.1}
    assert rejected(tree).startswith("value_loss_fn.homogeneous_group_weight: Input should be greater than")


def test_raw_reward_forbids_the_residual_baseline(tree):
    tree["ppo"]["adv_estimator"] = {"name": "raw_reward", "normalize_advantages": True, "residual_baseline": True}
    assert rejected(tree).startswith("ppo.adv_estimator.residual_baseline: must be false or absent")


def test_raw_reward_std_normalisation_needs_a_baseline(tree):
    tree["ppo"]["adv_estimator"] = {
        "name": "raw_reward",
        "normalize_advantages": False,
        "raw_reward_normalize_std": True,
    }
    assert rejected(tree).startswith(
        "ppo.adv_estimator.raw_reward_normalize_std: true needs raw_reward_baseline 'mean' or 'leave_one_out' "
        "(got 'none')"
    )
    tree["ppo"]["adv_estimator"]["raw_reward_baseline"] = "mean"
    del tree["value"]
    assert validate_tree(tree).ppo.adv_estimator.raw_reward_normalize_std


def test_reward_scaling_needs_a_source_range(tree):
    tree["ppo"]["reward_scaling"] = {"enabled": True, "source_min": 1.0, "source_max": 1.0}
    assert rejected(tree) == "ppo.reward_scaling.source_max: 1.0 must be greater than source_min=1.0"


def test_overlong_shaping_needs_its_lengths_unless_stop_properly(tree):
    tree["ppo"]["reward_shaping"] = {"enabled": True, "max_response_length": 10}
    assert rejected(tree) == (
        "ppo.reward_shaping.overlong_buffer_length: required when enabled=true and stop_properly_penalty_coef is null"
    )
    tree["ppo"]["reward_shaping"] = {"enabled": True, "stop_properly_penalty_coef": 0.5}
    validate_tree(tree)


def test_reference_kl_coefficient_may_not_be_negative(tree):
    tree["loss_fn"] = {"reference_policy_kl_penalty": -0.1}
    assert rejected(tree).startswith("loss_fn.reference_policy_kl_penalty: Input should be greater than or equal to 0")


def test_raw_reward_needs_no_critic(tree):
    tree["ppo"]["adv_estimator"] = {"name": "raw_reward", "normalize_advantages": False}
    del tree["value"]
    config = validate_tree(tree)
    assert config.value is None and not config.ppo.adv_estimator.uses_critic


def test_raw_reward_drops_the_value_section_with_one_note(tree, capsys):
    # The shipped configs carry a critic section; switching the estimator by one override must not start one.
    tree["ppo"]["adv_estimator"] = {"name": "raw_reward", "normalize_advantages": True}
    config = validate_tree(tree)
    assert config.value is None and not config.ppo.adv_estimator.uses_critic
    assert capsys.readouterr().err == (
        "note: value: ignored (section dropped): ppo.adv_estimator.name='raw_reward' trains no critic\n"
    )
    tree["value"] = None  # what `config show` writes: no note when reloaded
    assert validate_tree(tree).value is None
    assert capsys.readouterr().err == ""


def test_raw_reward_still_validates_the_value_section_it_drops(tree, capsys):
    tree["ppo"]["adv_estimator"] = {"name": "raw_reward", "normalize_advantages": True}
    tree["value"]["train_micro_batchsize"] = 4
    assert rejected(tree).startswith("value.train_micro_batchsize: unknown key")
    assert capsys.readouterr().err == ""


def test_raw_reward_has_no_critic_warm_up(tree):
    tree["ppo"]["adv_estimator"] = {"name": "raw_reward", "normalize_advantages": True}
    tree["ppo"]["policy_training_start_step"] = 2
    assert rejected(tree).startswith("ppo.policy_training_start_step: 2 asks for a critic-only warm-up")


def test_critic_estimators_need_the_value_section(tree):
    del tree["value"]
    assert rejected(tree).startswith("value: required: ppo.adv_estimator.name='gae' trains a critic")


def test_length_adaptive_alpha_may_not_be_null(tree):
    tree["ppo"]["adv_estimator"]["length_adaptive_alpha"] = None
    assert rejected(tree).startswith("ppo.adv_estimator.length_adaptive_alpha: may not be null")


@pytest.mark.parametrize(
    "key",
    [
        "gae_gamma",
        "gae_lambda",
        "gae_lambda_value",
        "gae_lambda_policy",
        "length_adaptive_alpha",
        "normalize_advantages",
        "residual_baseline",
    ],
)
def test_every_gae_key_is_required(tree, key):
    del tree["ppo"]["adv_estimator"][key]
    assert rejected(tree) == f"ppo.adv_estimator.{key}: required when name='gae' (missing)"


def test_decoupled_lambdas_accept_null_but_not_absence(tree):
    assert validate_tree(tree).ppo.adv_estimator.gae_lambda_value is None


@pytest.mark.parametrize("key", ["turn_gae_gamma", "turn_gae_lambda_value", "turn_gae_lambda_policy"])
def test_turn_gae_keys_are_required_and_non_null(tree, key):
    tree["ppo"]["adv_estimator"] = {
        "name": "turn_gae",
        "turn_gae_gamma": 1.0,
        "turn_gae_lambda_value": 1.0,
        "turn_gae_lambda_policy": 0.95,
        "normalize_advantages": True,
        "residual_baseline": False,
    }
    assert validate_tree(tree).ppo.adv_estimator.gamma == 1.0
    tree["ppo"]["adv_estimator"][key] = None
    assert rejected(tree) == f"ppo.adv_estimator.{key}: may not be null when name='turn_gae'"
    del tree["ppo"]["adv_estimator"][key]
    assert rejected(tree) == f"ppo.adv_estimator.{key}: required when name='turn_gae' (missing)"


def test_adv_estimator_is_required(tree):
    del tree["ppo"]["adv_estimator"]
    assert rejected(tree) == "ppo.adv_estimator: required key is missing"


def test_unsupported_estimator_names_the_allowed_values(tree):
    tree["ppo"]["adv_estimator"]["name"] = "vtrace"
    line = rejected(tree)
    assert line.startswith("ppo.adv_estimator.name: Input should be 'gae', 'turn_gae' or 'raw_reward'")


def test_async_needs_importance_sampling_correction(tree):
    tree["ppo"]["async_ppo"] = {"enabled": True}
    tree["generation"] = {"colocated": {"enabled": False}}
    assert rejected(tree).startswith("loss_fn.use_importance_sampling_correction: must be true")


def test_async_needs_non_colocated_generation(tree):
    tree["ppo"]["async_ppo"] = {"enabled": True}
    tree["loss_fn"] = {"use_importance_sampling_correction": True}
    assert rejected(tree).startswith("generation.colocated.enabled: must be false")
    tree["generation"] = {"colocated": {"enabled": False}}
    assert validate_tree(tree).ppo.async_ppo.enabled


def test_reward_penalties_need_the_gym(tree):
    tree["reward_penalties"] = {"penalize_empty_final_answer": True}
    assert rejected(tree).startswith("reward_penalties: penalties apply to gym results only")
    tree["env"] = {"should_use_nemo_gym": True}
    assert validate_tree(tree).reward_penalties.any_enabled


def test_unwanted_token_penalty_needs_token_ids(tree):
    tree["env"] = {"should_use_nemo_gym": True}
    tree["reward_penalties"] = {"penalize_unwanted_tokens": True}
    assert rejected(tree).startswith("reward_penalties.token_ids_unwanted: must list token ids")


def test_invalid_tool_call_penalty_needs_patterns(tree):
    tree["env"] = {"should_use_nemo_gym": True}
    tree["reward_penalties"] = {"penalize_invalid_tool_call": True}
    assert rejected(tree).startswith(
        "reward_penalties.penalize_invalid_tool_call: needs env.gym.invalid_tool_call_patterns"
    )
    tree["env"]["gym"] = {"invalid_tool_call_patterns": ["<tool_call>"]}
    assert validate_tree(tree).reward_penalties.any_enabled


@pytest.mark.parametrize(
    ("gym", "error"),
    [
        ({"thinking_tags": ["<think>", "<think>"]}, "env.gym.thinking_tags: ['<think>', '<think>'] must be"),
        ({"thinking_tags": ["", "</r>"]}, "env.gym.thinking_tags: ['', '</r>'] must be two different"),
        (
            {"invalid_tool_call_patterns": ["ok", "(unclosed"]},
            "env.gym.invalid_tool_call_patterns.1: '(unclosed' is not a regex: missing )",
        ),
        ({"reasoning_effort": "max"}, "env.gym.reasoning_effort: 'max' is not one of effort_levels"),
        ({"effort_levels": ["a"], "reasoning_effort": "low"}, "env.gym.reasoning_effort: 'low' is not one of"),
    ],
)
def test_gym_text_knobs_are_checked_at_load_time(tree, gym, error):
    tree["env"] = {"should_use_nemo_gym": True, "gym": gym}
    assert rejected(tree).startswith(error)


def test_gym_text_knobs_load(tree):
    tree["env"] = {
        "should_use_nemo_gym": True,
        "gym": {
            "thinking_tags": ["<reasoning>", "</reasoning>"],
            "invalid_tool_call_patterns": [r"<tool_call>", r"\{\s*\"name\""],
            "effort_levels": ["low", "high"],
            "reasoning_effort": "high",
        },
    }
    gym = validate_tree(tree).env.gym
    assert gym.thinking_tags == ("<reasoning>", "</reasoning>") and gym.reasoning_effort == "high"
    assert validate_tree({**tree, "env": {"should_use_nemo_gym": True}}).env.gym.thinking_tags == (
        "<think>",
        "</think>",
    )


@pytest.mark.parametrize("key", ["invalid_tool_call_advantage", "malformed_thinking_advantage"])
def test_advantage_overwrite_penalties_are_rejected_for_ppo(tree, key):
    tree["ppo"][key] = -1.0
    assert rejected(tree).startswith(f"ppo.{key}: overwrites advantages per message")
    tree["ppo"][key] = None
    validate_tree(tree)


def test_rollout_dump_period_is_required_when_dumping(tree):
    tree["ppo"]["log_rollout_dump"] = True
    assert rejected(tree) == "ppo.rollout_dump_period: required when log_rollout_dump is true"
    tree["ppo"]["rollout_dump_period"] = 5
    validate_tree(tree)


def test_reference_kl_needs_reference_logprobs(tree):
    tree["loss_fn"] = {"reference_policy_kl_penalty": 0.01}
    assert rejected(tree).startswith("ppo.skip_reference_policy_logprobs_calculation: must be false")


def test_dual_clip_constant_must_exceed_one(tree):
    tree["loss_fn"] = {"ratio_clip_c": 1.0}
    assert rejected(tree).startswith("loss_fn.ratio_clip_c: Input should be greater than 1")


def test_truncated_importance_sampling_needs_correction_and_a_ratio(tree):
    tree["loss_fn"] = {"truncated_importance_sampling_type": "tis"}
    assert rejected(tree).startswith("loss_fn.truncated_importance_sampling_type: needs use_importance_sampling")
    tree["loss_fn"]["use_importance_sampling_correction"] = True
    assert rejected(tree).startswith("loss_fn.truncated_importance_sampling_ratio: required")


def test_sequence_level_ratios_need_sequence_level_loss(tree):
    tree["loss_fn"] = {"sequence_level_importance_ratios": True}
    assert rejected(tree).startswith("loss_fn.sequence_level_importance_ratios: needs token_level_loss: false")


def test_force_on_policy_ratio_needs_one_optimizer_step_per_pass(tree):
    tree["loss_fn"] = {"force_on_policy_ratio": True}
    tree["model"]["train_global_batch_size"] = 4
    assert rejected(tree).startswith("loss_fn.force_on_policy_ratio: needs one optimizer step per PPO pass")
    tree["model"]["train_global_batch_size"] = 8
    validate_tree(tree)


def test_generation_length_must_leave_room_for_the_prompt(tree):
    tree["generation"] = {"max_new_tokens": 4096}
    assert rejected(tree).startswith("generation.max_new_tokens: 4096 leaves no room")


def test_keep_top_k_needs_a_metric(tree):
    tree["checkpointing"] = {"keep_top_k": 2}
    assert rejected(tree).startswith("checkpointing.metric_name: required when keep_top_k is set")
    tree["checkpointing"]["metric_name"] = "train:reward_mean"
    assert validate_tree(tree).checkpointing.metric_name == "train:reward_mean"


@pytest.mark.parametrize(
    ("name", "hint"),
    [("reward", ""), ("val:reward", ""), ("val:accuracy", " (NeMo-RL's val:accuracy is val:reward_mean here)")],
)
def test_ranking_metric_must_be_one_the_run_logs(tree, name, hint):
    tree["checkpointing"] = {"metric_name": name}
    assert rejected(tree) == (
        f"checkpointing.metric_name: {name!r} is not a metric the run logs{hint}; expected one of "
        f"{', '.join(RANKING_METRICS)}"
    )


def test_keep_top_k_by_a_validation_metric_needs_validations(tree):
    tree["checkpointing"] = {"keep_top_k": 2, "metric_name": "val:reward_mean"}
    assert rejected(tree).startswith("checkpointing.metric_name: 'val:reward_mean' is never logged: the run has no")
    tree["data"]["validation_fraction"] = 0.1
    assert rejected(tree).startswith("checkpointing.metric_name: 'val:reward_mean' ranks checkpoints by validation")
    tree["ppo"]["val_period"] = 5
    assert validate_tree(tree).checkpointing.keep_top_k == 2


def test_the_critic_uses_the_policys_tokenizer(tree):
    tree["value"]["tokenizer"] = "/models/other"
    assert rejected(tree).startswith("value.tokenizer: '/models/other' is not supported: the critic scores")


def test_checkpoint_deadline_is_parsed(tree):
    tree["checkpointing"] = {"checkpoint_must_save_by": "00:01:30:05"}
    assert validate_tree(tree).checkpointing.must_save_by_seconds == 5405.0
    tree["checkpointing"] = {"checkpoint_must_save_by": "90 minutes"}
    assert "is not DD:HH:MM:SS" in rejected(tree)


def test_reward_function_must_be_known_or_importable_name(tree):
    tree["env"] = {"reward_function": "mymodule.reward"}
    assert "is not 'math', 'exact_match' or 'module:function'" in rejected(tree)
    tree["env"] = {"reward_function": "mymodule:reward"}
    validate_tree(tree)


def test_reward_shaping_needs_lengths(tree):
    tree["ppo"]["reward_shaping"] = {"enabled": True}
    assert rejected(tree).startswith("ppo.reward_shaping.overlong_buffer_length: required")


def test_gym_rollouts_need_top_k_zero_and_no_stop_token_ids(tree):
    tree["env"] = {"should_use_nemo_gym": True}
    tree["generation"] = {"top_k": 20}
    assert rejected(tree).startswith("generation.top_k: must be 0 with env.should_use_nemo_gym (got 20)")
    tree["generation"] = {"stop_token_ids": [7]}
    assert rejected(tree).startswith("generation.stop_token_ids: must be null with env.should_use_nemo_gym")
    tree["generation"] = {}
    assert validate_tree(tree).env.gym.resources == ["math"]


def test_per_row_response_budgets_are_refused_with_the_gym(tree):
    tree["data"]["max_new_tokens_key"] = "budget"
    assert validate_tree(tree).data.max_new_tokens_key == "budget"  # reward-function rollouts read it
    tree["env"] = {"should_use_nemo_gym": True}
    assert rejected(tree).startswith("data.max_new_tokens_key: must be null with env.should_use_nemo_gym")


def test_external_gym_must_say_where_the_agents_are(tree):
    tree["env"] = {"should_use_nemo_gym": True, "gym": {"launch": "external"}}
    assert rejected(tree).startswith("env.gym.head_server_url: launch: external needs exactly one of")
    tree["env"]["gym"]["head_server_url"] = "http://127.0.0.1:5000"
    assert validate_tree(tree).env.gym.head_server_url == "http://127.0.0.1:5000"
    tree["env"]["gym"]["agent_urls"] = {"a": "http://127.0.0.1:5001"}
    assert rejected(tree).startswith("env.gym.head_server_url: launch: external needs exactly one of")
    tree["env"]["gym"] = {"head_server_url": "http://127.0.0.1:5000"}
    assert rejected(tree).startswith("env.gym.launch: builtin starts its own servers")


def test_max_rollout_turns_is_rejected_before_any_process_starts(tree):
    from asyncppo.trainer.setup import check_rollout_kind

    tree["ppo"]["max_rollout_turns"] = 3
    with pytest.raises(ConfigError, match="reward-function rollouts are single-turn"):
        check_rollout_kind(validate_tree(tree))
    tree["env"] = {"should_use_nemo_gym": True}
    with pytest.raises(
        ConfigError, match=r"gym agents bound their own turns \(the built-in agent: env.gym.max_steps\)"
    ):
        check_rollout_kind(validate_tree(tree))
    tree["ppo"]["max_rollout_turns"] = 1
    assert check_rollout_kind(validate_tree(tree)) == "gym"
    tree["env"]["gym"] = {"resources": ["math", "chess"]}
    with pytest.raises(ConfigError, match=r"env\.gym\.resources: unknown built-in environment 'chess'"):
        check_rollout_kind(validate_tree(tree))


def test_a_decaying_schedule_longer_than_the_run_warms_up_over_the_whole_run(tree, capsys):
    # The minimal run: 3 steps x 1 epoch x ceil(2 prompts * 4 generations / 8 per global batch) = 3 optimizer steps.
    tree["model"]["scheduler"] = {"name": "cosine", "warmup_steps": 4}
    assert validate_tree(tree).model.scheduler.warmup_steps == 3
    assert capsys.readouterr().err == (
        "note: model.scheduler.warmup_steps: 4 clamped to 3, the run's optimizer steps (ppo.max_num_steps=3 x "
        "ppo.ppo_epochs=1 x 1 per pass): the learning rate warms up over the whole run (set "
        "model.scheduler.total_steps to keep the schedule)\n"
    )
    tree["model"]["scheduler"]["warmup_steps"] = 3  # fits: kept, no note
    assert validate_tree(tree).model.scheduler.warmup_steps == 3
    tree["model"]["scheduler"] = {"name": "constant", "warmup_steps": 4}  # constant never decays: no length needed
    assert validate_tree(tree).model.scheduler.warmup_steps == 4
    assert capsys.readouterr().err == ""


def test_the_critic_schedule_counts_the_critic_passes_and_its_global_batch(tree, capsys):
    # 3 steps x 2 critic epochs x ceil(8 samples / 4 per global batch) = 12 optimizer steps.
    tree["ppo"]["critic_ppo_epochs"] = 2
    tree["value"].update(train_global_batch_size=4, scheduler={"name": "linear", "warmup_steps": 13})
    config = validate_tree(tree)
    assert config.value is not None and config.value.scheduler.warmup_steps == 12
    assert capsys.readouterr().err.startswith(
        "note: value.scheduler.warmup_steps: 13 clamped to 12, the run's optimizer steps (ppo.max_num_steps=3 x "
        "ppo.critic_ppo_epochs=2 x 2 per pass)"
    )


def test_a_dropped_critic_schedule_is_not_fitted(tree, capsys):
    tree["ppo"]["adv_estimator"] = {"name": "raw_reward", "normalize_advantages": True}
    tree["value"]["scheduler"] = {"name": "linear", "warmup_steps": 13}
    assert validate_tree(tree).value is None
    assert "value.scheduler" not in capsys.readouterr().err


def test_an_explicit_schedule_length_must_cover_the_warmup(tree):
    tree["model"]["scheduler"] = {"name": "linear", "warmup_steps": 5, "total_steps": 4}
    assert (
        rejected(tree)
        == "model.scheduler.warmup_steps: 5 is longer than model.scheduler.total_steps=4; expected at most 4"
    )
    tree["model"]["scheduler"]["total_steps"] = 5
    validate_tree(tree)


def test_the_critic_must_cover_the_policys_sequences(tree):
    tree["model"]["max_total_sequence_length"] = 512
    tree["value"]["max_total_sequence_length"] = 256
    assert rejected(tree).startswith(
        "value.max_total_sequence_length: 256 is shorter than model.max_total_sequence_length=512"
    )
    tree["value"]["max_total_sequence_length"] = 512
    validate_tree(tree)
