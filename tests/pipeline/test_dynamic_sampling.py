"""DAPO dynamic sampling through the real sync batch source and prompt stream: groups whose training rewards are
all equal are dropped with a reason, the step is filled from more generation batches, surplus groups are dropped,
and a step that stays short past the cap stops the run with an error naming the step.

The rewards come from a deterministic rollout (a pure function of the prompt row) and go through the trainer's
own reward processing (`group_training_rewards`), so the filter sees exactly what the step would train on.
"""

import functools
from typing import Any

import pytest

from asyncppo.config import validate_tree
from asyncppo.config.ppo import RewardScalingConfig
from asyncppo.data.prompt_stream import PromptStream
from asyncppo.pipeline.dynamic_sampling import (
    UNUSED_KEPT_GROUP,
    ZERO_REWARD_STD,
    DynamicSampling,
    DynamicSamplingError,
    has_reward_spread,
)
from asyncppo.pipeline.failures import StepFailureBudget
from asyncppo.pipeline.sources import GroupOutcome, SyncBatchSource
from asyncppo.trainer.ppo_step import StepSettings, group_training_rewards
from asyncppo.trainer.run_inputs import dynamic_sampling
from asyncppo.types import MessageSpan, Trajectory
from ppo_settings import gae, gae_section, plain_step_settings

Row = dict[str, Any]
GENERATIONS = 2


def step_settings(reward_scaling: RewardScalingConfig | None = None) -> StepSettings:
    return plain_step_settings(gae(normalize_advantages=True, gae_lambda=0.95), reward_scaling=reward_scaling)


class RewardByRow:
    """A GroupRolloutFn whose group for row i gets rewards `rewards_of(i)` (one per generation); records calls."""

    def __init__(self, rewards_of) -> None:
        self.rewards_of = rewards_of
        self.calls: list[list[int]] = []

    def __call__(self, rows, group_ids) -> list[GroupOutcome]:
        self.calls.append([row["index"] for row in rows])
        return [self._group(row, group_id) for row, group_id in zip(rows, group_ids, strict=True)]

    def _group(self, row: Row, group_id: int) -> list[Trajectory]:
        return [
            Trajectory(
                token_ids=[1, 2, 3],
                loss_mask=[0, 1, 1],
                generation_logprobs=[0.0, -0.5, -0.5],
                prompt_length=1,
                message_log=[MessageSpan("user", 1), MessageSpan("assistant", 2)],
                reward=reward,
                group_id=group_id,
                sample_index=sample,
                policy_version=0,
                last_policy_version=0,
                task=dict(row),
            )
            for sample, reward in enumerate(self.rewards_of(row["index"]))
        ]


def half_solved(index: int) -> list[float]:
    """Even rows: one right, one wrong (spread). Odd rows: both right (zero std)."""
    return [0.0, 1.0] if index % 2 == 0 else [1.0, 1.0]


def build(
    rewards_of,
    *,
    batch_multiplier: int = 1,
    max_gen_batches: int = 10,
    settings: StepSettings | None = None,
    num_rows: int = 64,
) -> tuple[SyncBatchSource, RewardByRow]:
    rows = [{"index": index} for index in range(num_rows)]
    rollout = RewardByRow(rewards_of)
    sampling = DynamicSampling(
        batch_multiplier=batch_multiplier,
        max_gen_batches=max_gen_batches,
        group_rewards=functools.partial(group_training_rewards, settings or step_settings()),
    )
    source = SyncBatchSource(
        PromptStream(rows, batch_size=4, seed=0, shuffle=False),
        rollout,
        num_prompts_per_step=4,
        failure_budget=StepFailureBudget(0, "env.gym.max_failed_groups_per_step"),
        dynamic_sampling=sampling,
    )
    return source, rollout


def trained_rows(batch) -> list[int]:
    return sorted({trajectory.task["index"] for trajectory in batch.trajectories})


def test_zero_std_groups_are_dropped_and_the_step_is_filled_from_another_generation_batch():
    source, rollout = build(half_solved)
    batch = source.next_batch(0)
    # Batch 1 (rows 0-3) keeps 0 and 2; batch 2 (rows 4-7) keeps 4 and 6: the step is full after two batches.
    assert rollout.calls == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert trained_rows(batch) == [0, 2, 4, 6]
    assert batch.num_prompts == 4 and len(batch.trajectories) == 4 * GENERATIONS
    assert batch.metrics["dynamic_sampling/num_gen_batches"] == 2.0
    assert batch.metrics["dynamic_sampling/filtered_groups"] == 4.0
    assert batch.metrics["dynamic_sampling/kept_fraction"] == 0.5
    assert batch.metrics["dynamic_sampling/surplus_groups"] == 0.0
    assert batch.metrics["dynamic_sampling/generated_reward_mean"] == pytest.approx(0.75)
    assert batch.metrics["rollout/failed_groups"] == 0.0
    books = source.accounting()
    assert books.problems == [] and books.next_draw_id == 8
    assert books.trained == [(0, 1), (2, 3), (4, 5), (6, 7)]
    assert books.dropped == {ZERO_REWARD_STD: [(1, 2), (3, 4), (5, 6), (7, 8)]}

    # The next step starts from fresh prompts (nothing is carried over) and keeps the books balanced.
    second = source.next_batch(1)
    assert trained_rows(second) == [8, 10, 12, 14]
    assert source.accounting().problems == []


def test_a_larger_generation_batch_fills_the_step_at_once_and_drops_the_surplus_with_a_reason():
    source, rollout = build(half_solved, batch_multiplier=3)
    batch = source.next_batch(0)
    assert rollout.calls == [list(range(12))]
    # Six groups pass the filter (0, 2, ..., 10); the step trains the first four in draw order.
    assert trained_rows(batch) == [0, 2, 4, 6]
    assert batch.metrics["dynamic_sampling/num_gen_batches"] == 1.0
    assert batch.metrics["dynamic_sampling/kept_fraction"] == 0.5
    assert batch.metrics["dynamic_sampling/surplus_groups"] == 2.0
    books = source.accounting()
    assert books.problems == []
    assert books.dropped[UNUSED_KEPT_GROUP] == [(8, 9), (10, 11)]
    assert len(books.dropped[ZERO_REWARD_STD]) == 6


def test_the_filter_sees_the_rewards_after_reward_scaling():
    # Odd rows get raw rewards 2 and 3 (they differ), but reward scaling clamps both to source_max = 1 first:
    # the step would train on equal rewards, so those groups are filtered like the all-equal ones.
    def rewards_of(index: int) -> list[float]:
        return [0.0, 1.0] if index % 2 == 0 else [2.0, 3.0]

    unscaled, _ = build(rewards_of)
    assert trained_rows(unscaled.next_batch(0)) == [0, 1, 2, 3]
    scaling = RewardScalingConfig(enabled=True, source_min=0.0, source_max=1.0, target_min=-1.0, target_max=1.0)
    scaled, rollout = build(rewards_of, settings=step_settings(scaling))
    batch = scaled.next_batch(0)
    assert trained_rows(batch) == [0, 2, 4, 6] and len(rollout.calls) == 2
    # The trajectories keep their raw rewards; the step scales them again when it processes its batch.
    assert sorted({t.reward for t in batch.trajectories}) == [0.0, 1.0]


def test_a_reward_without_variance_hits_the_cap_and_the_error_names_the_step():
    source, rollout = build(lambda index: [1.0, 1.0], max_gen_batches=3)
    with pytest.raises(DynamicSamplingError) as caught:
        source.next_batch(4)
    message = str(caught.value)
    assert message.startswith("dynamic sampling: step 5 drew 3 generation batches (12 prompt groups) and kept 0")
    assert "ppo.dynamic_sampling_max_gen_batches=3" in message
    assert "Raise ppo.dynamic_sampling_max_gen_batches" in message and "lower ppo.num_prompts_per_step" in message
    assert "check the reward" in message
    assert len(rollout.calls) == 3  # the cap: no fourth batch is drawn
    assert source.accounting().problems == []


def test_groups_kept_before_the_cap_are_booked_as_unused():
    source, _ = build(lambda index: [0.0, 1.0] if index == 1 else [0.5, 0.5], max_gen_batches=2)
    with pytest.raises(DynamicSamplingError, match=r"step 1 drew 2 generation batches .* and kept 1 groups"):
        source.next_batch(0)
    books = source.accounting()
    assert books.problems == [] and books.trained == []
    assert books.dropped[UNUSED_KEPT_GROUP] == [(1, 2)]


def test_a_resumed_source_draws_the_same_next_step():
    source, _ = build(half_solved)
    source.next_batch(0)
    snapshot = source.snapshot()
    expected = source.next_batch(1)
    resumed, _ = build(half_solved)
    resumed.load_state_dict(snapshot.state)
    batch = resumed.next_batch(1)
    assert trained_rows(batch) == trained_rows(expected) == [8, 10, 12, 14]
    assert [t.group_id for t in batch.trajectories] == [t.group_id for t in expected.trajectories]
    assert resumed.accounting() == source.accounting()


def test_reward_spread_is_tested_exactly():
    assert has_reward_spread([0.0, 1e-12]) and not has_reward_spread([0.1, 0.1, 0.1])
    with pytest.raises(ValueError, match="no trajectories"):
        has_reward_spread([])


def test_the_run_builds_dynamic_sampling_from_its_config_with_its_reward_processing():
    ppo = {
        "num_prompts_per_step": 2,
        "num_generations_per_prompt": 2,
        "max_num_steps": 1,
        "ppo_epochs": 1,
        "adv_estimator": gae_section(normalize_advantages=True, gae_lambda=0.95),
    }
    tree: dict[str, Any] = {
        "model": {"model_name": "tiny:tiny", "train_micro_batch_size": 4},
        "value": {"train_micro_batch_size": 4},
        "data": {"train_path": "train.jsonl"},
        "ppo": ppo,
    }
    assert dynamic_sampling(validate_tree(tree)) is None
    ppo.update(
        use_dynamic_sampling=True,
        batch_multiplier=3,
        dynamic_sampling_max_gen_batches=5,
        reward_scaling={"enabled": True, "source_min": 0.0, "source_max": 1.0, "target_min": -1.0, "target_max": 1.0},
    )
    sampling = dynamic_sampling(validate_tree(tree))
    assert sampling is not None
    assert (sampling.batch_multiplier, sampling.max_gen_batches) == (3, 5)
    group = RewardByRow(lambda index: [0.0, 2.0])._group({"index": 0}, group_id=0)
    assert list(sampling.group_rewards(group)) == [-1.0, 1.0]  # scaled: clamp to [0, 1], map onto [-1, 1]
