"""Reward-function runs' failure budget (ppo.max_failed_groups_per_step): a prompt group whose reward function raises,
returns a non-number or hangs past env.reward_timeout_s is that group's failure; with the default budget of 0 the
first one stops the run in one line naming the function and the key, with a budget the groups are replaced.

The trainer's own rollout functions and batch sources, on the tiny model's real engine in this process."""

import dataclasses
import json
import threading
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from asyncppo.config import ConfigError, RunConfig, validate_tree
from asyncppo.generation.hf_generator import HFGenerator
from asyncppo.models.policy import load_policy
from asyncppo.pipeline.buffer import FAILED_ROLLOUT
from asyncppo.pipeline.errors import CollectorError, StepFillError
from asyncppo.rollout.rewards import RewardFunction, RewardFunctionError
from asyncppo.trainer.preflight import CheckedInputs
from asyncppo.trainer.run_inputs import RolloutFunctions, batch_source, single_turn_rollouts
from asyncppo.trainer.setup import RunSetup, resolve_setup
from ppo_settings import tiny_run_tree

ROWS = [{"prompt": f"{n}+1=", "answer": str(n + 1), "id": n} for n in range(8)]


@pytest.fixture
def engine_setup(
    tmp_path: Path, shared_cache_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[tuple[RunSetup, HFGenerator]]:
    """The tiny run's setup (tokenizer, end ids) and an engine over its policy."""
    monkeypatch.setenv("ASYNCPPO_CACHE_DIR", str(shared_cache_dir))  # the tiny model, built once per session
    rows = tmp_path / "train.jsonl"
    rows.write_text("".join(json.dumps(row) + "\n" for row in ROWS))
    setup = resolve_setup(validate_tree(tiny_run_tree(str(rows))), inputs=CheckedInputs(ROWS, [], None))
    engine = HFGenerator(
        load_policy(setup.paths.policy),
        eos_token_ids=list(setup.eos_token_ids),
        pad_token_id=setup.pad_token_id,
        max_batch_size=16,
        device="cpu",
        seed=0,
        max_context_length=64,
    )
    yield setup, engine
    engine.close()


def _rollouts(
    engine_setup: tuple[RunSetup, HFGenerator], reward_fn: RewardFunction, **sections: dict[str, Any]
) -> tuple[RunConfig, RolloutFunctions]:
    """The run's config with each section's keys in `sections` set, and its reward-function rollouts."""
    setup, engine = engine_setup
    tree = tiny_run_tree(str(setup.config.data.train_path))
    for section, keys in sections.items():
        tree.setdefault(section, {}).update(keys)
    config = validate_tree(tree)
    return config, single_turn_rollouts(dataclasses.replace(setup, config=config), engine, reward_fn)


def _failing_on(ids: set[int]) -> RewardFunction:
    def reward(response_text: str, row: Mapping[str, Any]) -> float:
        if row["id"] in ids:
            raise ValueError(f"cannot grade row {row['id']}")
        return 1.0

    return reward


def test_with_no_budget_the_first_raising_group_stops_the_step_naming_the_function_and_the_key(engine_setup):
    config, rollouts = _rollouts(engine_setup, _failing_on({1}))
    source = batch_source(config, ROWS, rollouts, lambda seed: None, 0)
    with pytest.raises(StepFillError) as raised:
        source.next_batch(0)
    message = str(raised.value)
    assert message.startswith(
        "step 1 could not be filled: 1 prompt group failed while filling it, more than "
        "ppo.max_failed_groups_per_step=0; last failure (group "
    )
    assert f"RewardFunctionError: reward function {__name__}._failing_on.<locals>.reward raised ValueError: " in message
    assert "\n" not in message


def test_within_the_budget_failed_groups_are_dropped_and_replaced(engine_setup):
    config, rollouts = _rollouts(
        engine_setup, _failing_on({1, 2}), ppo={"max_failed_groups_per_step": 2}, data={"shuffle": False}
    )
    # Unshuffled, the stream draws rows 0, 1, ... in order: rows 1 and 2 fail, rows 3 and 4 take their places.
    source = batch_source(config, ROWS, rollouts, lambda seed: None, 0)
    batch = source.next_batch(0)
    assert sorted({trajectory.task["id"] for trajectory in batch.trajectories}) == [0, 3]
    assert batch.metrics["rollout/failed_groups"] == 2.0
    assert source.accounting().dropped == {FAILED_ROLLOUT: [(1, 3)]}  # draw ids 1 and 2, as [start, end)


def test_a_reward_that_hangs_fails_its_group_at_the_deadline_and_later_groups_are_not_scored(engine_setup):
    released = threading.Event()
    calls: list[int] = []

    def hangs(response_text: str, row: Mapping[str, Any]) -> float:
        calls.append(row["id"])
        released.wait()
        return 1.0

    config, rollouts = _rollouts(engine_setup, hangs, env={"reward_timeout_s": 0.2})
    source = batch_source(config, ROWS, rollouts, lambda seed: None, 0)
    try:
        with pytest.raises(StepFillError, match=r"RewardTimeoutError: reward function .*hangs did not return within "):
            source.next_batch(0)
    finally:
        released.set()
    # One deadline, not one per group: with the budget spent, the step's other group is never handed to the function.
    assert len(calls) == 1


def test_async_collection_stops_on_a_failed_group_past_the_budget(engine_setup):
    config, rollouts = _rollouts(
        engine_setup,
        _failing_on({0, 1, 2, 3, 4, 5, 6, 7}),
        ppo={"async_ppo": {"enabled": True}},
        loss_fn={"use_importance_sampling_correction": True},
        generation={"colocated": {"enabled": False}},
    )
    source = batch_source(config, ROWS, rollouts, lambda seed: None, 0)
    try:
        with pytest.raises(CollectorError) as raised:
            source.next_batch(0)
    finally:
        source.close()
    assert isinstance(raised.value.__cause__, StepFillError)
    assert "more than ppo.max_failed_groups_per_step=0" in str(raised.value)


def test_validation_skips_failed_groups_within_the_budget_and_stops_past_it(engine_setup):
    _, rollouts = _rollouts(engine_setup, _failing_on({1}), ppo={"max_failed_groups_per_step": 1})
    trajectories, num_failed = rollouts.validation(ROWS[:3], 2)
    assert num_failed == 1 and sorted({t.task["id"] for t in trajectories}) == [0, 2]

    _, rollouts = _rollouts(engine_setup, _failing_on({0, 1}), ppo={"max_failed_groups_per_step": 1})
    with pytest.raises(RewardFunctionError) as raised:
        rollouts.validation(ROWS[:3], 2)
    assert str(raised.value).startswith(
        "validation: 2 prompt groups failed, more than ppo.max_failed_groups_per_step=1; last failure: reward "
        f"function {__name__}._failing_on.<locals>.reward raised ValueError: cannot grade row 1 for row 1 "
    )


def test_the_reward_runs_budget_key_is_refused_in_a_gym_run_pointing_to_the_gym_key():
    tree = tiny_run_tree("rows.jsonl")
    tree["env"] = {"should_use_nemo_gym": True}
    tree["ppo"]["max_failed_groups_per_step"] = 3
    with pytest.raises(ConfigError) as raised:
        validate_tree(tree)
    assert raised.value.lines == [
        "ppo.max_failed_groups_per_step: applies to reward-function runs only: with env.should_use_nemo_gym the "
        "failure budget is env.gym.max_failed_groups_per_step; set that instead"
    ]
