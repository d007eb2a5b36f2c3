"""value.privileged_critic: its load-time rules, its plain settings and the value budgets it raises."""

from pathlib import Path

import pytest
from rejections import rejected

from asyncppo.config import validate_tree
from asyncppo.trainer import builders
from asyncppo.trainer.setup import ModelPaths


def _privileged(tree, **section):
    tree["value"]["privileged_critic"] = {"enabled": True, "fields": [{"name": "answer"}], **section}
    return tree


def test_off_by_default_with_no_settings_and_no_raised_budget(tree):
    config = validate_tree(tree)
    assert config.value is not None and not config.value.privileged_critic.enabled
    assert builders.enabled_privileged_critic(config) is None and not builders.step_settings(config).privileged_critic
    assert config.value.critic_max_total_sequence_length == config.value.max_total_sequence_length


def test_the_enabled_section_reaches_the_critic_with_fields_in_priority_order(tree):
    _privileged(
        tree,
        fields=[{"name": "meta.gold", "title": "gold", "max_tokens": 64}, {"name": "answer"}],
        max_total_tokens=100,
    )
    config = validate_tree(tree)
    section = builders.enabled_privileged_critic(config)
    assert config.value is not None and section is config.value.privileged_critic
    assert [(field.name, field.resolved_title, field.max_tokens) for field in section.fields] == [
        ("meta.gold", "gold", 64),
        ("answer", "answer", None),
    ]
    assert section.max_total_tokens == 100
    assert builders.step_settings(config).privileged_critic


def test_enabled_needs_fields(tree):
    tree["value"]["privileged_critic"] = {"enabled": True}
    assert rejected(tree) == "value.privileged_critic.fields: must list at least one task field when enabled is true"


def test_needs_a_critic(tree):
    tree["ppo"]["adv_estimator"] = {"name": "raw_reward", "normalize_advantages": True}
    assert rejected(_privileged(tree)).startswith(
        "value.privileged_critic.enabled: needs a critic, but ppo.adv_estimator.name='raw_reward' trains none"
    )


def test_titles_must_be_unique_tag_names(tree):
    _privileged(tree, fields=[{"name": "a.answer", "title": "answer"}, {"name": "answer"}])
    assert rejected(tree).startswith("value.privileged_critic.fields: duplicate title ['answer']")
    _privileged(tree, fields=[{"name": "gold answer"}])
    assert rejected(tree).startswith("value.privileged_critic.fields.0.title: 'gold answer' is not a tag name")


def test_unknown_keys_arerejected(tree):
    _privileged(tree, fields=[{"name": "answer", "cap": 3}])
    assert "value.privileged_critic.fields.0.cap" in rejected(tree)


def test_value_budgets_are_raised_by_the_reserve_only_when_enabled(tree):
    tree["value"]["max_tokens_per_microbatch"] = 1000
    _privileged(tree, max_total_tokens=200, template_margin_tokens=50)
    config = validate_tree(tree)
    assert config.value is not None
    assert config.value.critic_max_total_sequence_length == 2048 + 250
    assert config.value.critic_max_tokens_per_microbatch == 1000 + 250
    paths = ModelPaths(policy=Path("policy"), tokenizer=Path("policy"), value=Path("policy"))
    assert builders.value_worker_settings(config, paths).max_tokens_per_microbatch == 1250
    tree["value"]["privileged_critic"]["enabled"] = False
    value = validate_tree(tree).value
    assert value is not None and value.critic_max_tokens_per_microbatch == 1000


@pytest.mark.parametrize("placement", ["user_suffix", "user_prefix", "system"])
def test_placement_and_template_load(tree, placement):
    _privileged(tree, placement=placement, template="[for the critic]\n{answer} {{braces}}")
    config = validate_tree(tree)
    assert config.value is not None and config.value.privileged_critic.placement == placement


def test_placement_defaults_to_the_user_suffix_with_the_bare_block(tree):
    config = validate_tree(_privileged(tree))
    assert config.value is not None
    assert (config.value.privileged_critic.placement, config.value.privileged_critic.template) == (
        "user_suffix",
        "{answer}",
    )


@pytest.mark.parametrize(
    ("template", "found"),
    [("no placeholder", "[]"), ("{answer} and {answer}", "['answer', 'answer']"), ("{gold}", "['gold']")],
)
def test_the_template_needs_its_placeholder_once(tree, template, found):
    _privileged(tree, template=template)
    assert rejected(tree).startswith(
        f"value.privileged_critic.template: {template!r} must contain the placeholder {{answer}} exactly once and no "
        f"other field (found {found})"
    )


def test_an_unknown_placement_isrejected(tree):
    _privileged(tree, placement="assistant")
    assert rejected(tree).startswith("value.privileged_critic.placement: Input should be 'user_suffix'")
