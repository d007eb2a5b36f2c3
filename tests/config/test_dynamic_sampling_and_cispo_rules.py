"""Load-time rules of DAPO dynamic sampling (ppo.use_dynamic_sampling, batch_multiplier) and of loss_fn.use_cispo."""

import pytest
from rejections import rejected

from asyncppo.config import validate_tree


def test_dynamic_sampling_is_off_by_default_and_valid_on_a_sync_run(tree):
    config = validate_tree(tree)
    assert (config.ppo.use_dynamic_sampling, config.ppo.dynamic_sampling_max_gen_batches) == (False, 10)
    assert config.ppo.batch_multiplier == 1
    tree["ppo"].update(use_dynamic_sampling=True, batch_multiplier=3, dynamic_sampling_max_gen_batches=4)
    config = validate_tree(tree)
    assert (config.ppo.batch_multiplier, config.ppo.dynamic_sampling_max_gen_batches) == (3, 4)


def test_batch_multiplier_needs_dynamic_sampling(tree):
    tree["ppo"]["batch_multiplier"] = 2
    assert rejected(tree).startswith("ppo.batch_multiplier: 2 draws extra prompts only for dynamic sampling")


def test_dynamic_sampling_is_refused_with_async_ppo(tree):
    tree["ppo"].update(use_dynamic_sampling=True, async_ppo={"enabled": True})
    tree["loss_fn"] = {"use_importance_sampling_correction": True}
    assert rejected(tree).startswith("ppo.use_dynamic_sampling: is for synchronous runs")


def test_dynamic_sampling_needs_two_generations_per_prompt(tree):
    tree["ppo"].update(use_dynamic_sampling=True, num_generations_per_prompt=1)
    assert rejected(tree).startswith("ppo.use_dynamic_sampling: keeps only groups whose rewards differ")


@pytest.mark.parametrize("bad", [0, -1])
def test_dynamic_sampling_cap_and_multiplier_are_positive(tree, bad: int):
    tree["ppo"].update(use_dynamic_sampling=True, dynamic_sampling_max_gen_batches=bad)
    assert rejected(tree).startswith("ppo.dynamic_sampling_max_gen_batches: Input should be greater than 0")
    tree["ppo"].update(dynamic_sampling_max_gen_batches=10, batch_multiplier=bad)
    assert rejected(tree).startswith("ppo.batch_multiplier: Input should be greater than 0")


@pytest.mark.parametrize(
    ("other", "message"),
    [
        ({"disable_ppo_ratio": True}, "loss_fn.use_cispo: true contradicts disable_ppo_ratio"),
        ({"force_on_policy_ratio": True}, "loss_fn.use_cispo: true contradicts force_on_policy_ratio"),
        ({"ratio_clip_c": 3.0}, "loss_fn.ratio_clip_c: 3.0 bounds the PPO surrogate, which use_cispo replaces"),
    ],
)
def test_cispo_refuses_options_that_redefine_the_surrogate(tree, other: dict[str, object], message: str):
    tree["loss_fn"] = {"use_cispo": True, **other}
    assert rejected(tree).startswith(message)


def test_cispo_alone_is_valid(tree):
    tree["loss_fn"] = {"use_cispo": True, "ratio_clip_max": 0.28}
    assert validate_tree(tree).loss_fn.use_cispo
