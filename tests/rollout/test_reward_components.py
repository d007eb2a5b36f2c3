"""reward/<component> metrics: per-component means over a step's trajectories, with sanitised names."""

from asyncppo.rollout.reward_components import metric_safe_name, reward_component_metrics
from asyncppo.types import MessageSpan, Trajectory


def _trajectory(components: dict[str, float]) -> Trajectory:
    return Trajectory(
        token_ids=[1, 2],
        loss_mask=[0, 1],
        generation_logprobs=[0.0, -0.5],
        prompt_length=1,
        message_log=[MessageSpan("user", 1), MessageSpan("assistant", 1)],
        reward=sum(components.values()),
        group_id=0,
        sample_index=0,
        policy_version=0,
        last_policy_version=0,
        reward_components=components,
    )


def test_each_component_is_averaged_over_the_trajectories_that_report_it():
    trajectories = [
        _trajectory({"correct": 1.0, "format": 0.5}),
        _trajectory({"correct": 0.0, "format": 0.25}),
        _trajectory({"correct": 1.0}),  # no format: averaged over the two that report it
        _trajectory({}),
    ]
    # correct: (1 + 0 + 1) / 3; format: (0.5 + 0.25) / 2.
    assert reward_component_metrics(trajectories) == {"reward/correct": 2 / 3, "reward/format": 0.375}
    assert reward_component_metrics(trajectories[:1], namespace="val/") == {
        "val/reward/correct": 1.0,
        "val/reward/format": 0.5,
    }


def test_no_components_no_metrics():
    assert reward_component_metrics([_trajectory({})]) == {}
    assert reward_component_metrics([]) == {}


def test_names_are_sanitised_and_pooled_when_they_collide():
    assert metric_safe_name("code/passed tests:unit") == "code_passed_tests_unit"
    assert metric_safe_name("") == "_"
    trajectories = [_trajectory({"a b": 1.0}), _trajectory({"a/b": 0.0})]
    assert reward_component_metrics(trajectories) == {"reward/a_b": 0.5}
