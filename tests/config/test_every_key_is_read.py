"""Every config key is read by the code: a key nothing reads validates and does nothing, and a user porting a
NeMo-RL config cannot tell it from one that works.

The check walks the schema (nested sections and lists of sections) and, for each leaf field name, looks for a
read of it in src/asyncppo outside src/asyncppo/config/: an attribute load `.name` or the name as a whole string
literal (`getattr(x, "name")`, dict keys), found with `ast`, so comments and docstrings never count. It goes by
name, so a field shared by two sections (`model.X` and `value.X`) counts as read when either is read.

The few keys config code consumes itself are listed below with why, and each entry is checked: a derived
property must read the field and be read outside the config, a rejected key must really be rejected, and an
entry the scan finds on its own is stale and fails.
"""

import ast
import inspect
import typing
from collections.abc import Iterator
from functools import cache
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

from asyncppo.config import ConfigError, RunConfig, validate_tree

SRC = Path(__file__).parents[2] / "src" / "asyncppo"
CONFIG_PACKAGE = SRC / "config"

# Keys read only through config properties: key -> the chain of properties (Class.property), each reading the
# previous link (the first reads the field); the last is read by the code outside the config.
READ_THROUGH_PROPERTIES: dict[str, tuple[str, ...]] = {
    # The validation profile falls back to the training values; rollouts and the policy server read the profile.
    "generation.val_temperature": ("GenerationConfig.validation_profile",),
    "generation.val_top_p": ("GenerationConfig.validation_profile",),
    # Megabytes in the file, bytes on the wire: the weight sync reads the bytes.
    "generation.weight_sync.bucket_size_mb": ("WeightSyncConfig.bucket_size_bytes",),
    # Parsed from DD:HH:MM:SS once; the driver reads the seconds.
    "checkpointing.checkpoint_must_save_by": ("CheckpointingConfig.must_save_by_seconds",),
    # Part of the privileged block's reserve, which raises the critic's token budget (builders.value_factory).
    "value.privileged_critic.template_margin_tokens": (
        "PrivilegedCriticConfig.reserved_tokens",
        "ValueModelConfig.critic_max_tokens_per_microbatch",
    ),
    # The advantage code reads the estimator's discount, the KL-in-reward switch and the field tags through the
    # sections' derived values.
    "ppo.adv_estimator.gae_gamma": ("AdvEstimatorConfig.gamma",),
    "ppo.adv_estimator.turn_gae_gamma": ("AdvEstimatorConfig.gamma",),
    "loss_fn.use_kl_in_reward": ("PolicyLossConfig.uses_kl_in_reward",),
    "value.privileged_critic.fields.*.title": ("PrivilegedFieldConfig.resolved_title",),
}
# Keys accepted only at their default, so configs written for NeMo-RL port unchanged: key -> a value the rules
# reject, naming the key (nothing else reads them, by design).
REJECTED_UNLESS_DEFAULT: dict[str, Any] = {
    # GRPO-only advantage overwrites; they would break PPO's A = G - V.
    "ppo.invalid_tool_call_advantage": -1.0,
    "ppo.malformed_thinking_advantage": -1.0,
}


def _sections_in(annotation: Any) -> list[type[BaseModel]]:
    """Section classes an annotation holds: directly, in an Optional / union, or as list or dict items."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return [section for arg in typing.get_args(annotation) for section in _sections_in(arg)]


def _leaf_keys(section: type[BaseModel], prefix: str = "") -> Iterator[str]:
    """Dotted path of every leaf field; list items are written `<list>.*.<field>`."""
    for name, info in section.model_fields.items():
        children = _sections_in(info.annotation)
        if not children:
            yield f"{prefix}{name}"
        for child in children:
            is_list = typing.get_origin(info.annotation) is list
            yield from _leaf_keys(child, f"{prefix}{name}.*." if is_list else f"{prefix}{name}.")


@cache
def _names_read_outside_config() -> frozenset[str]:
    """Attribute names loaded, and whole string literals, in every module outside the config package."""
    names: set[str] = set()
    for path in SRC.rglob("*.py"):
        if path.is_relative_to(CONFIG_PACKAGE):
            continue
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Load):
                names.add(node.attr)
            elif isinstance(node, ast.Constant) and isinstance(node.value, str):
                names.add(node.value)
    return frozenset(names)


def _unread_keys() -> list[str]:
    read = _names_read_outside_config()
    return [key for key in _leaf_keys(RunConfig) if key.rsplit(".", 1)[-1] not in read]


def _section_class(name: str) -> type[BaseModel]:
    return {cls.__name__: cls for cls in _all_sections(RunConfig)}[name]


def _all_sections(section: type[BaseModel]) -> Iterator[type[BaseModel]]:
    yield section
    for info in section.model_fields.values():
        for child in _sections_in(info.annotation):
            yield from _all_sections(child)


def test_the_walk_reaches_nested_sections_and_list_items():
    keys = set(_leaf_keys(RunConfig))
    assert {"ppo.adv_estimator.gae_lambda", "value.privileged_critic.fields.*.max_tokens", "cluster.num_nodes"} <= keys


def test_every_config_key_is_read_outside_the_config_package():
    allowed = READ_THROUGH_PROPERTIES.keys() | REJECTED_UNLESS_DEFAULT.keys()
    unexplained = [key for key in _unread_keys() if key not in allowed]
    assert unexplained == [], (
        f"config keys nothing outside src/asyncppo/config reads: {unexplained}. Wire each one, remove it, or "
        "reject its unsupported values at load time (then list it in REJECTED_UNLESS_DEFAULT)"
    )


def test_the_allow_lists_hold_only_keys_the_scan_cannot_find():
    stale = sorted((READ_THROUGH_PROPERTIES.keys() | REJECTED_UNLESS_DEFAULT.keys()) - set(_unread_keys()))
    assert stale == [], f"read directly now, remove from the allow-lists: {stale}"


@pytest.mark.parametrize("key", sorted(READ_THROUGH_PROPERTIES))
def test_keys_read_through_properties_reach_the_code(key: str):
    previous = key.rsplit(".", 1)[-1]
    for link in READ_THROUGH_PROPERTIES[key]:
        class_name, _, property_name = link.partition(".")
        prop = vars(_section_class(class_name))[property_name]
        assert isinstance(prop, property) and prop.fget is not None, link
        assert f".{previous}" in inspect.getsource(prop.fget), f"{link} does not read {previous}"
        previous = property_name
    assert previous in _names_read_outside_config(), f"{previous} is not read outside the config"


@pytest.mark.parametrize("key", sorted(REJECTED_UNLESS_DEFAULT))
def test_keys_accepted_only_at_their_default_reject_other_values(tree: dict[str, Any], key: str):
    node = tree
    *parents, leaf = key.split(".")
    for part in parents:
        node = node.setdefault(part, {})
    node[leaf] = REJECTED_UNLESS_DEFAULT[key]
    with pytest.raises(ConfigError) as caught:
        validate_tree(tree)
    assert caught.value.lines[0].startswith(f"{key}: "), caught.value.lines
