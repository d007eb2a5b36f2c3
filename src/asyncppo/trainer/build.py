"""Building a run from its config: Ray worker groups, weight sync, data, sinks, checkpoints -> `Run`.

    build_run(config, run_dir) -> Run: policy / value / generation groups, WeightSync (non-colocated),
                                       BatchSource, validation rows, MetricsLogger, CheckpointManager
`preflight` (trainer/preflight.py) checks sinks, reward function and data, `check_supported` refuses what this
build cannot place, and `check_device_fit` (trainer/placement.py) a GPU demand above the cluster's, all before
any process starts.
"""

from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from asyncppo.checkpoint import (
    CheckpointManager,
    load_run_state,
)
from asyncppo.config import ConfigError, RunConfig
from asyncppo.metrics import ConsoleProgress, JsonlSink, MetricsLogger, TensorBoardSink
from asyncppo.models.tokenizer import load_tokenizer
from asyncppo.pipeline.failures import StepFailureBudget
from asyncppo.trainer import builders
from asyncppo.trainer.perf import perf_meter
from asyncppo.trainer.placement import check_device_fit
from asyncppo.trainer.preflight import preflight
from asyncppo.trainer.privileged_critic import PrivilegedCritic
from asyncppo.trainer.resume import check_resume, record_config
from asyncppo.trainer.run_inputs import (
    FAILURE_BUDGET_KEY,
    RolloutFunctions,
    batch_source,
    single_turn_rollouts,
)
from asyncppo.trainer.worker_start import (
    PLACEMENT_FILE,
    placement_summary,
    ray_start_options,
    start_workers,
    write_placement,
)
from asyncppo.workers.ray_host import init_local_ray
from asyncppo.workers.reservations import stop_workers

if TYPE_CHECKING:  # the gym's HTTP stack (fastapi, uvicorn, httpx) is imported only by runs that use the gym
    pass

from asyncppo.trainer.run import GYM_RESULTS_FILE, PublishedVersion, Run


def check_supported(config: RunConfig) -> None:
    """Fail before starting anything when the config asks for a mode this version does not run yet."""
    if config.ppo.max_rollout_turns != 1:
        where = (
            "gym agents bound their own turns (the built-in agent: env.gym.max_steps)"
            if config.env.should_use_nemo_gym
            else "reward-function rollouts are single-turn; multi-turn rollouts come from the gym"
        )
        raise ConfigError([f"ppo.max_rollout_turns: {config.ppo.max_rollout_turns} is not supported: {where}"])
    if config.env.should_use_nemo_gym and config.env.gym.launch == "builtin":
        from asyncppo.trainer.gym_setup import check_builtin_resources

        check_builtin_resources(config.env.gym.resources)


def build_run(config: RunConfig, run_dir: Path, config_dir: Path | None = None) -> Run:
    """Start Ray and every worker, connect weight sync, and open data, sinks and checkpoints.

    `config_dir`: the directory of the config file, searched (with the working directory) for the reward module.
    """
    checked = preflight(config, config_dir)  # before anything is written or started: a mistake costs nothing
    check_supported(config)
    train_rows, validation_rows = checked.train_rows, checked.validation_rows
    resume = check_resume(config, run_dir)  # a config that breaks the checkpoint's run is refused here too
    device = builders.resolve_device(config)
    layout = check_device_fit(config, device, torch.cuda.device_count() if device == "cuda" else 0)
    run_dir.mkdir(parents=True, exist_ok=True)
    paths = builders.ModelPaths.resolve(config)
    perf = perf_meter(config, paths, layout, device)
    tokenizer = load_tokenizer(paths.tokenizer)
    eos, pad = builders.end_and_pad_ids(config, tokenizer, paths.tokenizer)
    engine = builders.engine_settings(config, eos, pad)
    record_config(config, run_dir, resume)  # last before processes start: an attempt refused earlier writes nothing
    gpu = device == "cuda"
    init_local_ray(**ray_start_options(config, layout, gpu))
    workers = start_workers(config, paths, device, engine, layout)
    groups, reservations = workers.groups, workers.reservations
    policy, value, generator, weight_sync = workers.policy, workers.value, workers.generator, workers.weight_sync
    try:
        placement = write_placement(run_dir / PLACEMENT_FILE, groups)
    except BaseException:
        stop_workers(groups, reservations)
        raise
    if layout.total > 2 or config.cluster.num_nodes > 1:  # a one-device-per-role run has nothing to report
        print(placement_summary(placement), flush=True)
    published = PublishedVersion()
    gym = None
    if config.env.should_use_nemo_gym:
        from asyncppo.trainer.gym_setup import start_gym_rollouts

        try:
            results_log = run_dir / GYM_RESULTS_FILE if config.env.should_log_nemo_gym_responses else None
            gym = start_gym_rollouts(
                config, generator, tokenizer, str(paths.tokenizer), lambda: published.value, results_log
            )
        except BaseException:
            stop_workers(groups, reservations)
            raise
        rollouts = RolloutFunctions(
            gym.rollout(config.ppo.num_generations_per_prompt),
            gym.validation,
            StepFailureBudget(config.env.gym.max_failed_groups_per_step, FAILURE_BUDGET_KEY),
        )
    else:
        assert checked.reward_function is not None, "preflight loads it for every run without the gym"
        rollouts = single_turn_rollouts(config, generator, tokenizer, eos, checked.reward_function)
    checkpoints = None
    if config.checkpointing.enabled:
        checkpoint_dir = Path(config.checkpointing.checkpoint_dir or run_dir / "checkpoints")
        checkpoints = CheckpointManager(
            checkpoint_dir,
            config.checkpointing.keep_top_k,
            config.checkpointing.metric_name,
            config.checkpointing.higher_is_better,
        )
    latest = checkpoints.latest() if checkpoints is not None else None
    resume_step = load_run_state(latest).step if latest is not None else 0
    source = batch_source(config, train_rows, rollouts, generator, resume_step)
    privilege = builders.enabled_privileged_critic(config)
    return Run(
        config=config,
        run_dir=run_dir,
        step_settings=builders.step_settings(config),
        policy=policy,
        value=value,
        generator=generator,
        weight_sync=weight_sync,
        source=source,
        validation_rows=validation_rows,
        validation_rollout=rollouts.validation,
        metrics=_metrics_logger(config, run_dir, resume_step),
        checkpoints=checkpoints,
        pad_token_id=pad,
        published=published,
        tokenizer=tokenizer,
        perf=perf,
        groups=groups,
        reservations=reservations,
        gym=gym,
        privileged_critic=PrivilegedCritic(tokenizer, privilege, pad) if privilege is not None else None,
        # auto picks graph only on CUDA (an unsupported family then falls back to hf and reports nothing).
        engines_keep_counters=engine.backend == "graph" or (engine.backend == "auto" and gpu),
    )


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


def _explained_variance_hint(config: RunConfig) -> str:
    """The line printed the first time the critic's explained variance is negative (see docs/critic.md)."""
    estimator = config.ppo.adv_estimator
    if estimator.residual_baseline:
        group = config.ppo.num_generations_per_prompt
        floor = -1 / (group - 1)
        untrained = f"an untrained critic scores -1/(G-1) = {floor:.2f} here"
        return f"hint: EV < 0 is usual early: {untrained}; see docs/critic.md"
    return "hint: EV < 0 (critic worse than the mean return) is usual early, until it learns; see docs/critic.md"


def _metrics_logger(config: RunConfig, run_dir: Path, resume_step: int) -> MetricsLogger:
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
                negative_hints={EXPLAINED_VARIANCE_KEY: _explained_variance_hint(config)},
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
    return MetricsLogger(sinks, best_effort_sinks=remote)
