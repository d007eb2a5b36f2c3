"""A run's metric sinks and its console line: metrics.jsonl (cut back to the resumed step), TensorBoard, the
console progress line with its headline metrics and first-time hints, the optional remote trackers, and the
metric aliases of logger.metric_aliases.

Called by `trainer/build.py`. Remote sinks (W&B, MLflow) are best effort: a tracker that fails never stops the run.
"""

from pathlib import Path
from typing import Any

from asyncppo.config import RunConfig
from asyncppo.metrics import ConsoleProgress, JsonlSink, MetricsLogger, TensorBoardSink
from asyncppo.metrics.aliases import nemo_rl_aliases

HEADLINE_KEYS = {
    "train/reward_mean": "reward",
    "val/reward_mean": "val",
    "async/buffer_size": "buf",
    "async/avg_policy_age": "age",
    "critic/explained_var": "EV",
    "mismatch/token_mult_prob_error": "mismatch",
}
"""The metrics of the console's per-step line and their short labels (the line fits 100 columns)."""
EXPLAINED_VARIANCE_KEY = "critic/explained_var"


def explained_variance_hint(config: RunConfig) -> str:
    """The line printed the first time the critic's explained variance is negative (see docs/critic.md)."""
    estimator = config.ppo.adv_estimator
    if estimator.residual_baseline:
        group = config.ppo.num_generations_per_prompt
        floor = -1 / (group - 1)
        untrained = f"an untrained critic scores -1/(G-1) = {floor:.2f} here"
        return f"hint: EV < 0 is usual early: {untrained}; see docs/critic.md"
    return "hint: EV < 0 (critic worse than the mean return) is usual early, until it learns; see docs/critic.md"


def metric_aliases(config: RunConfig) -> dict[str, str]:
    """Source name -> alias for logger.metric_aliases (`nemo_rl`); {} when off.

    Whether a step is one policy global batch decides the loss-function aliases (`metrics/aliases.py`): the step
    batch is num_prompts_per_step x num_generations_per_prompt samples (dynamic sampling and failed gym groups
    keep that count), and model.train_global_batch_size null takes it whole.
    """
    if config.logger.metric_aliases is None:
        return {}
    num_samples = config.ppo.num_prompts_per_step * config.ppo.num_generations_per_prompt
    global_batch = config.model.train_global_batch_size
    return nemo_rl_aliases(one_global_batch=global_batch is None or num_samples <= global_batch)


def metrics_logger(config: RunConfig, run_dir: Path, resume_step: int) -> MetricsLogger:
    """The sinks the logger section enables; metrics.jsonl keeps only the records up to `resume_step`."""
    logger = config.logger
    sinks: list[Any] = [JsonlSink(run_dir / "metrics.jsonl", truncate_after_step=resume_step)]
    if logger.tensorboard_enabled:
        sinks.append(TensorBoardSink(run_dir / "tensorboard"))
    if logger.console:
        sinks.append(
            ConsoleProgress(
                config.ppo.max_num_steps,
                resume_step,
                headline=HEADLINE_KEYS,
                negative_hints={EXPLAINED_VARIANCE_KEY: explained_variance_hint(config)},
            )
        )
    remote: list[Any] = []
    if logger.wandb_enabled:
        from asyncppo.metrics import WandbSink

        remote.append(
            WandbSink(
                logger.wandb.project,
                logger.wandb.name or run_dir.name,
                logger.wandb.entity,
                config.model_dump(mode="json"),
            )
        )
    if logger.mlflow_enabled:
        from asyncppo.metrics import MlflowSink

        remote.append(MlflowSink(logger.mlflow.experiment_name, logger.mlflow.tracking_uri, run_dir))
    return MetricsLogger(sinks, best_effort_sinks=remote, aliases=metric_aliases(config))
