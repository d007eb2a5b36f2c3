"""checkpointing.metric_name is checked at load time against config.runtime.RANKING_METRICS; that list must be
exactly the val/ and train/ metrics the driver logs, or a valid name would be refused (or a dead one accepted and
keep_top_k would silently keep the newest checkpoints)."""

import torch
from ppo_fakes import GAE, CallLog, FakePolicy, FakeValue, collate, settings_from_config, single_turn

from asyncppo.config.runtime import RANKING_METRICS
from asyncppo.trainer.ppo_step import ppo_step
from asyncppo.trainer.validation import Validation


def _rankable(metrics: dict[str, float], namespace: str) -> set[str]:
    """The keys of `namespace`/ written the way metric_name names them (`val/x` -> `val:x`)."""
    return {key.replace("/", ":", 1) for key in metrics if key.startswith(f"{namespace}/")}


def test_train_ranking_metrics_are_the_train_metrics_a_step_logs():
    batch = collate([single_turn(2, 2, reward, group, group) for group, reward in enumerate([1.0, 0.0, 1.0, 0.0])])
    output = ppo_step(
        settings_from_config(GAE), FakePolicy(CallLog()), FakeValue(CallLog(), torch.zeros(4, 4)), batch, 0
    )
    assert _rankable(output.metrics, "train") == {name for name in RANKING_METRICS if name.startswith("train:")}


def test_val_ranking_metrics_are_the_metrics_a_validation_logs():
    trajectories = [single_turn(2, 2, reward, 0, index) for index, reward in enumerate([1.0, 0.0])]
    validation = Validation(
        [{"prompt": "1+1="}],
        rollout=lambda rows, generations: (trajectories, 0),
        num_generations_per_prompt=2,
        reseed=lambda step, offset: None,
    )
    metrics = validation.run(0)
    assert _rankable(metrics, "val") == {name for name in RANKING_METRICS if name.startswith("val:")}
