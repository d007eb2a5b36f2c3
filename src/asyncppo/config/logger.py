"""The `logger` section: where a run's metrics and records go (metrics.jsonl is always written)."""

from typing import Literal

from pydantic import Field, NonNegativeInt, PositiveInt

from asyncppo.config.base import Section


class WandbConfig(Section):
    """Weights & Biases sink (the `wandb` extra)."""

    project: str = "asyncppo"
    """W&B project."""
    name: str | None = None
    """Run name; null = the run directory name."""
    entity: str | None = None
    """W&B entity (team or user)."""


class MlflowConfig(Section):
    """MLflow sink (the `mlflow` extra)."""

    experiment_name: str = "asyncppo"
    """MLflow experiment."""
    tracking_uri: str | None = None
    """Tracking server; null = a local `mlruns/` in the run directory."""


class LoggerConfig(Section):
    """Metric sinks; metrics.jsonl in the run directory is always written."""

    log_dir: str = "runs/default"
    """Run directory (config, metrics, checkpoints, plots); `asyncppo train --run-dir` overrides it."""
    console: bool = True
    """Show the progress bar and per-step summary."""
    verbose: bool = False
    """Also show the third-party output that is off by default: Hugging Face progress bars (loading and saving
    weights) and Ray's token-authentication notice."""
    tensorboard_enabled: bool = True
    """Write TensorBoard events to the run directory."""
    wandb_enabled: bool = False
    """Log to Weights & Biases."""
    mlflow_enabled: bool = False
    """Log to MLflow."""
    wandb: WandbConfig = WandbConfig()
    """W&B settings."""
    mlflow: MlflowConfig = MlflowConfig()
    """MLflow settings."""
    mismatch_plot_threshold: float = Field(default=1.05, gt=1)
    """Plot the worst sequence's logprobs when token_mult_prob_error exceeds this."""
    mismatch_plot_period: PositiveInt = 10
    """At most one mismatch plot per this many steps: a step above the threshold is plotted when at least this
    many steps passed since the last plot and its error is larger than those of the previous N - 1 steps."""
    metric_aliases: Literal["nemo_rl"] | None = None
    """`nemo_rl`: also log each metric that has a NeMo-RL counterpart of the same meaning under NeMo-RL's name
    (`train/token_mult_prob_error`, `validation/accuracy`, ...; README "NeMo-RL metric names"); null = only
    asyncppo's names."""
    train_data_period: NonNegativeInt = 1
    """Write `train_data/train_data_step{N}.jsonl` (one line per trained sample: prompt and response texts, token
    counts, reward and its components, mean advantage, group id, policy version) every N steps; 0 = never. Off
    while env.should_log_nemo_gym_responses logs the raw gym results instead, as in NeMo-RL."""
