"""The algorithm sections: NeMo-RL's `ppo` (kept as asyncppo's `ppo`) and `grpo` (asyncppo's `ppo` with the
GRPO-style `raw_reward` estimator), their defaults, the reward penalties and the PR-era value extras.

A GRPO config trains no critic: advantages are each sample's reward less its group's (leave-one-out) mean,
divided by the group's reward std when `normalize_rewards`, on one policy pass per step. Keys whose NeMo-RL
default differs from asyncppo's, or that asyncppo requires, are filled in with NeMo-RL's default when the file
leaves them out (`with_algorithm_defaults`), so the ported run does what NeMo-RL would have done.
"""

import copy
from typing import Any, cast

from asyncppo.config.nemo_rl.rules import (
    Outcome,
    Rule,
    Source,
    backend,
    lacks,
    mapped,
    neutral,
    neutral_when,
)

# NeMo-RL's defaults (its PPOConfig / GRPOConfig) for the keys asyncppo requires or defaults differently.
ALGORITHM_DEFAULTS: dict[str, dict[str, Any]] = {
    "ppo": {
        "num_prompts_per_step": 32,
        "num_generations_per_prompt": 16,
        "max_num_epochs": 100000,
        "max_num_steps": 100000,
        "ppo_epochs": 4,
        "val_period": 20,
        "val_at_start": True,
        "val_at_end": False,
        "max_val_samples": 256,
    },
    "grpo": {
        "num_prompts_per_step": 32,
        "num_generations_per_prompt": 16,
        "max_num_epochs": 1,
        "max_num_steps": 1000000,
        "val_period": 10,
        "val_at_end": False,
        "max_val_samples": 256,
        "skip_reference_policy_logprobs_calculation": False,
    },
}
ESTIMATOR_DEFAULTS: dict[str, dict[str, Any]] = {
    "ppo": {
        "name": "gae",
        "gae_lambda": 0.95,
        "gae_gamma": 1.0,
        "normalize_advantages": True,
        "gae_lambda_value": None,
        "gae_lambda_policy": None,
        "length_adaptive_alpha": 0.0,
    },
    "grpo": {"name": "grpo", "normalize_rewards": True, "use_leave_one_out_baseline": True},
}
"""NeMo-RL's estimator when the section is absent (PPO), or for each absent key (GRPO's pydantic defaults)."""
FILLED_NOTE = "absent from the file: NeMo-RL's default"


def with_algorithm_defaults(tree: dict[str, Any]) -> tuple[dict[str, Any], set[str]]:
    """A copy of `tree` with NeMo-RL's defaults written in for the absent algorithm keys, and those keys."""
    filled_tree = copy.deepcopy(tree)
    filled: set[str] = set()
    for algorithm, defaults in ALGORITHM_DEFAULTS.items():
        section = filled_tree.get(algorithm)
        if not isinstance(section, dict):
            continue
        section = cast(dict[str, Any], section)
        estimator = section.get("adv_estimator")
        if algorithm == "grpo" and isinstance(estimator, dict):
            defaults = {**defaults, **{f"adv_estimator.{k}": v for k, v in ESTIMATOR_DEFAULTS["grpo"].items()}}
        elif "adv_estimator" not in section:
            defaults = {**defaults, **{f"adv_estimator.{k}": v for k, v in ESTIMATOR_DEFAULTS[algorithm].items()}}
        for dotted, value in defaults.items():
            node, *rest = dotted.split(".")
            if not rest and node not in section:
                section[node] = value
                filled.add(f"{algorithm}.{dotted}")
            elif rest and rest[0] not in cast(dict[str, Any], section.setdefault(node, {})):
                section[node][rest[0]] = value
                filled.add(f"{algorithm}.{dotted}")
    return filled_tree, filled


def _both(name: str, rule: Rule) -> list[tuple[str, Rule]]:
    """The same rule for NeMo-RL's `ppo.<name>` and `grpo.<name>`."""
    return [(f"ppo.{name}", rule), (f"grpo.{name}", rule)]


def _critic_estimator(key: str, value: Any, source: Source) -> Outcome:
    """PPO's `adv_estimator.name`; gae and turn_gae need residual_baseline, which NeMo-RL's PPO does not have."""
    if value in ("gae", "turn_gae") and not source.has("ppo.adv_estimator.residual_baseline"):
        assignments = {key: value, "ppo.adv_estimator.residual_baseline": False}
        return Outcome(
            "mapped", f"{key} (residual_baseline=false: NeMo-RL's {value} has no residual baseline)", assignments
        )
    return mapped(key, value)


_GRPO_ESTIMATOR = "ppo.adv_estimator"


def _grpo_estimator(_key: str, value: Any, source: Source) -> Outcome:
    """GRPO's estimator name: `grpo` is asyncppo's raw_reward, on one policy pass per step, not whitened."""
    if value == "grpo":
        assignments = {
            f"{_GRPO_ESTIMATOR}.name": "raw_reward",
            f"{_GRPO_ESTIMATOR}.normalize_advantages": False,
            "ppo.ppo_epochs": 1,
        }
        note = "GRPO: group-baselined rewards, no critic, no whitening; ppo.ppo_epochs=1 (one pass per step)"
        return Outcome("mapped", f"{_GRPO_ESTIMATOR}.name=raw_reward ({note})", assignments)
    features = {
        "reinforce_plus_plus": "Reinforce++ estimator",
        "gdpo": "GDPO estimator (advantages per reward component)",
        "opd": "on-policy distillation estimator",
    }
    return Outcome("refused", f"{value!r}: {lacks(features.get(str(value), f'{value!r} advantage estimator'))}")


def _grpo_only(rule: Rule) -> Rule:
    """A GRPO-estimator setting: read only when the estimator is `grpo` (else the name's row refuses it)."""

    def guarded(key: str, value: Any, source: Source) -> Outcome:
        if source.get("grpo.adv_estimator.name") != "grpo":
            return Outcome("backend", "a setting of the estimator, refused at grpo.adv_estimator.name")
        return rule(key, value, source)

    return guarded


def _leave_one_out(_key: str, value: Any, _source: Source) -> Outcome:
    baseline = "leave_one_out" if value else "mean"
    return mapped(f"{_GRPO_ESTIMATOR}.raw_reward_baseline", baseline, "the group's mean reward without the sample")


def _normalize_rewards(_key: str, value: Any, source: Source) -> Outcome:
    target = f"{_GRPO_ESTIMATOR}.raw_reward_normalize_std"
    if value is True and source.get("grpo.adv_estimator.use_leave_one_out_baseline") is True:
        # NeMo-RL's leave-one-out std is over the other G-1 rewards; asyncppo's is the group's unbiased std.
        return mapped(target, True, "by the group's reward std; NeMo-RL's leave-one-out std spans the other G-1")
    return mapped(target, value is True)


def _max_num_epochs(key: str, value: Any, _source: Source) -> Outcome:
    if isinstance(value, int) and not isinstance(value, bool) and value < 1:
        return mapped("ppo.max_num_epochs", None, f"{value} = no epoch bound: the run stops at ppo.max_num_steps")
    return mapped("ppo.max_num_epochs", value)


def _max_rollout_turns(key: str, value: Any, _source: Source) -> Outcome:
    if value is None:
        return Outcome("neutral", "no cap: gym agents bound their turns")
    return mapped("ppo.max_rollout_turns", value)


def _val_period(_key: str, value: Any, _source: Source) -> Outcome:
    if isinstance(value, int) and not isinstance(value, bool) and value < 0:
        return mapped("ppo.val_period", 0, f"{value} = never periodically")
    return mapped("ppo.val_period", value)


def _advantage_overwrite(_key: str, value: Any, _source: Source) -> Outcome:
    if value is None:
        return Outcome("neutral", "off: advantages are not overwritten, as asyncppo trains")
    return Outcome("refused", f"{value!r}: {lacks('advantage overwrite of flagged tokens')}")


def _token_ids_unwanted(_key: str, value: Any, _source: Source) -> Outcome:
    if value in (None, []):
        return Outcome("neutral", "no unwanted token ids (reward_penalties.token_ids_unwanted: [])")
    return mapped("reward_penalties.token_ids_unwanted", value)


def _swe_privileged_critic(_key: str, value: Any, source: Source) -> Outcome:
    """NeMo-RL's SWE privileged critic: a system-message reference block of the instance's patch and tests."""
    if value is not True:
        return Outcome("neutral", "off, as asyncppo runs by default")
    given: Any = source.get("value.swe_privileged_critic.caps")
    caps = cast(dict[str, Any], given) if isinstance(given, dict) else {}
    fields = [
        {"name": f"{SWE_METADATA}.{name}", "title": title, "max_tokens": caps.get(title, cap)}
        for name, title, cap in SWE_FIELDS
    ]
    total = source.get("value.swe_privileged_critic.max_total_tokens", 32768)
    section = "value.privileged_critic"
    assignments = {
        f"{section}.enabled": True,
        f"{section}.placement": "system",
        f"{section}.fields": fields,
        f"{section}.max_total_tokens": total,
    }
    note = "placement=system, fields in NeMo-RL's budget order (the block lists them in that order too)"
    return Outcome("mapped", f"{section} ({note})", assignments)


SWE_METADATA = "responses_create_params.metadata"
# (row field under SWE_METADATA, title, NeMo-RL's token cap), in the order NeMo-RL spends the budget.
SWE_FIELDS = (
    ("FAIL_TO_PASS", "fail_to_pass", 24576),
    ("golden_patch", "golden_patch", 16384),
    ("test_patch", "test_patch", 4096),
    ("PASS_TO_PASS", "pass_to_pass", 4096),
)


def _swe_setting(key: str, value: Any, source: Source) -> Outcome:
    if source.get("value.swe_privileged_critic.enabled") is not True:
        return Outcome("neutral", "the SWE privileged critic is off")
    if key.endswith("max_total_tokens"):
        return mapped("value.privileged_critic.max_total_tokens", value)
    return Outcome("mapped", "value.privileged_critic.fields (a field's max_tokens; see the enabled row)")


def _math_privileged_critic(_key: str, value: Any, source: Source) -> Outcome:
    """NeMo-RL's math privileged critic: a note with the reference answer (the row's `answer`, see data.answer_key)."""
    if value is not True:
        return Outcome("neutral", "off, as asyncppo runs by default")
    tokens = source.get("value.privileged_critic.max_answer_tokens", 256)
    assignments = {
        "value.privileged_critic.enabled": True,
        "value.privileged_critic.fields": [{"name": "answer", "max_tokens": tokens}],
    }
    note = (
        "fields=[answer]"
        if source.has("value.privileged_critic.template")
        else ("fields=[answer]; NeMo-RL's default note text is not asyncppo's `{answer}`: set template to keep it")
    )
    return Outcome("mapped", f"value.privileged_critic ({note})", assignments)


def _math_privileged_setting(key: str, value: Any, source: Source) -> Outcome:
    if source.get("value.privileged_critic.enabled") is not True:
        return Outcome("neutral", "the privileged critic is off")
    if key.endswith("max_answer_tokens"):
        return Outcome("mapped", "value.privileged_critic.fields (the answer field's max_tokens)")
    if key.rpartition(".")[2] in ("placement", "template"):
        return mapped(key, value)
    return Outcome("refused", f"{value!r}: {lacks('such privileged-critic setting')}")


ALGORITHM_RULES: list[tuple[str, Rule]] = [
    *_both("val_batch_size", backend("asyncppo validates in decode batches of generation.max_batch_size")),
    *_both("calculate_advantages_on_gpu", backend("advantages are computed where asyncppo's driver runs")),
    *_both("max_rollout_turns", _max_rollout_turns),
    *_both("max_num_epochs", _max_num_epochs),
    *_both("val_period", _val_period),
    ("ppo.adv_estimator.name", _critic_estimator),
    ("ppo.warm_start_value_checkpoint", lambda _k, v, _s: mapped("value.warm_start_path", v)),
    (
        "ppo.async_ppo.warmup_generation_lead_steps",
        lambda _k, v, _s: mapped("ppo.async_ppo.warmup_max_trajectory_age_steps", v, "the warm-up trajectory age"),
    ),
    ("grpo.adv_estimator.name", _grpo_estimator),
    ("grpo.adv_estimator.use_leave_one_out_baseline", _grpo_only(_leave_one_out)),
    ("grpo.adv_estimator.normalize_rewards", _grpo_only(_normalize_rewards)),
    ("grpo.adv_estimator.minus_baseline", neutral("read by the Reinforce++ estimator only")),
    ("grpo.adv_estimator.*", backend("a setting of the estimator named at grpo.adv_estimator.name")),
    ("grpo.normalize_rewards", neutral("the estimator's copy, grpo.adv_estimator.normalize_rewards, is mapped")),
    (
        "grpo.use_leave_one_out_baseline",
        neutral("the estimator's copy, grpo.adv_estimator.use_leave_one_out_baseline, is mapped"),
    ),
    ("grpo.val_start_at", neutral_when((-1, 0), "validation may start at any step", lacks("validation start step"))),
    ("grpo.advantage_clip_*", neutral_when((None,), "advantages are not clipped", lacks("advantage clipping"))),
    (
        "grpo.stop_at_validation_*",
        neutral_when((None,), "no early stop", lacks("early stop at a validation metric")),
    ),
    ("grpo.invalid_tool_call_advantage", _advantage_overwrite),
    ("grpo.malformed_thinking_advantage", _advantage_overwrite),
    (
        "grpo.penalize_*",
        neutral("NeMo-RL does not read it (the *_advantage keys switch the overwrites; refused there when set)"),
    ),
    ("grpo.invalid_tool_call_strategy", neutral("NeMo-RL does not read it (see grpo.invalid_tool_call_advantage)")),
    ("grpo.async_grpo", neutral("no async block: the synchronous loop")),
    (
        "grpo.async_grpo.max_generation_failures",
        neutral_when((0,), "the first generation failure stops the run", lacks("tolerance of generator failures")),
    ),
    ("grpo.deduplicate_multimodal_data", neutral("multimodal payloads only; asyncppo trains on text")),
    ("grpo.debug_payload_metrics", backend("payload metrics of NeMo-RL's data plane")),
    ("reward_penalties.token_ids", neutral("no token ids: no unwanted-token penalty ids")),
    ("reward_penalties.token_ids.unwanted", _token_ids_unwanted),
    ("reward_penalties.token_ids.think_*", backend("asyncppo finds think tags by their text (env.gym.thinking_tags)")),
    ("value.swe_privileged_critic.enabled", _swe_privileged_critic),
    ("value.swe_privileged_critic.*", _swe_setting),
    ("value.privileged_critic.enabled", _math_privileged_critic),
    ("value.privileged_critic.max_answer_tokens", _math_privileged_setting),
    ("value.privileged_critic.*", _math_privileged_setting),
]
