"""Building a run: Ray worker groups, weight sync, rollouts, data, sinks, checkpoints -> `Run`.

    build_run(config, run_dir) = start_run(resolve_setup(config, data=True), run_dir)
    start_run: resume checked -> devices fitted -> an external gym answers -> config recorded -> Ray -> workers
               (policy, value, generators, weight sync) -> rollout functions (gym servers or the reward function)
               -> checkpoints -> batch source at the resumed step -> sinks -> Run
`resolve_setup` (trainer/setup.py) runs the pre-flight (sinks, reward function, data) and refuses what this build
cannot run; `check_resume` a config that breaks its checkpoint's run; `check_device_fit` (trainer/placement.py) a
GPU demand above the cluster's: all before any process starts.
"""

import functools
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from asyncppo.config import RunConfig
from asyncppo.trainer import builders
from asyncppo.trainer.generation_side import GenerationSide, PublishedVersion
from asyncppo.trainer.perf import PerfMeter, perf_meter
from asyncppo.trainer.placement import Layout, check_device_fit
from asyncppo.trainer.privileged_critic import PrivilegedCritic
from asyncppo.trainer.resume import ResumePlan, check_resume, prepare_checkpoints, record_config
from asyncppo.trainer.run import OwnedResources, Run
from asyncppo.trainer.run_checkpoints import RunCheckpoints
from asyncppo.trainer.run_inputs import RolloutFunctions, batch_source, start_rollouts
from asyncppo.trainer.run_metrics import metrics_logger
from asyncppo.trainer.schedule import Schedule
from asyncppo.trainer.setup import RunSetup, resolve_setup
from asyncppo.trainer.step_records import StepRecords
from asyncppo.trainer.validation import Validation
from asyncppo.trainer.worker_start import (
    PLACEMENT_FILE,
    StartedWorkers,
    placement_summary,
    ray_start_options,
    record_restart,
    start_workers,
    write_placement,
)
from asyncppo.workers.ray_cluster import init_local_ray

if TYPE_CHECKING:  # the gym's HTTP stack (fastapi, uvicorn, httpx) is imported only by runs that use the gym
    from asyncppo.trainer.gym_setup import GymRollouts

GYM_RESULTS_FILE = "gym_results.jsonl"


def build_run(config: RunConfig, run_dir: Path, config_dir: Path | None = None) -> Run:
    """The whole build from a config: `config_dir` (the config file's directory) is searched, with the working
    directory, for the reward function's module."""
    return start_run(resolve_setup(config, config_dir, data=True), run_dir)


def start_run(setup: RunSetup, run_dir: Path, resume_from: str | None = None) -> Run:
    """Start Ray and every worker, connect weight sync and rollouts, and open data, sinks and checkpoints; resume from
    the newest checkpoint that verifies, or from `resume_from` (`step_N` or a checkpoint directory) when given."""
    config = setup.config
    resume = check_resume(config, run_dir, resume_from)  # verified once; a config that breaks its run is refused
    gpu = setup.device == "cuda"
    layout = check_device_fit(config, setup.device, torch.cuda.device_count() if gpu else 0)
    if config.env.should_use_nemo_gym:  # an external gym's URLs answer, or the run stops here, having written nothing
        from asyncppo.trainer.gym_setup import wait_for_external_gym  # the gym's HTTP stack: gym runs only

        wait_for_external_gym(config)
    run_dir.mkdir(parents=True, exist_ok=True)
    perf = perf_meter(config, setup.paths, layout, setup.device)
    record_config(config, run_dir, resume)  # last before processes start: an attempt refused earlier writes nothing
    prepare_checkpoints(resume)
    init_local_ray(**ray_start_options(config, layout, gpu))
    workers = start_workers(setup, layout)
    try:
        return _assemble(setup, run_dir, workers, layout, perf, resume)
    except BaseException:
        workers.stop()
        raise


def _assemble(
    setup: RunSetup, run_dir: Path, workers: StartedWorkers, layout: Layout, perf: PerfMeter, resume: ResumePlan
) -> Run:
    """The run around its started workers: placement record, rollouts (gym servers closed again on failure), then
    checkpoints, batch source, sinks, schedule."""
    config = setup.config
    placement = write_placement(run_dir / PLACEMENT_FILE, workers.groups)
    if workers.supervisor is not None:  # a restarted generator's new process id goes on record
        workers.supervisor.on_restart = functools.partial(record_restart, run_dir / PLACEMENT_FILE, "generator")
    if layout.total > 2 or config.cluster.num_nodes > 1:  # a one-device-per-role run has nothing to report
        print(placement_summary(placement), flush=True)
    published = PublishedVersion()
    results_log = run_dir / GYM_RESULTS_FILE if config.env.should_log_nemo_gym_responses else None
    rollouts, gym = start_rollouts(setup, workers.generator, lambda: published.value, results_log)
    try:
        return _run(setup, run_dir, workers, rollouts, gym, perf, published, resume)
    except BaseException:
        if gym is not None:
            gym.close()
        raise


def _run(
    setup: RunSetup,
    run_dir: Path,
    workers: StartedWorkers,
    rollouts: RolloutFunctions,
    gym: "GymRollouts | None",
    perf: PerfMeter,
    published: PublishedVersion,
    resume: ResumePlan,
) -> Run:
    config = setup.config
    start_step = resume.step
    inputs = setup.checked_inputs
    source = batch_source(
        config, inputs.train_rows, rollouts, workers.generator.reseed, start_step, health=workers.supervisor
    )
    generation = GenerationSide(
        workers.generator,
        workers.supervisor,
        reseed_source=source.reseed_generation,
        seed=config.ppo.seed,
        published=published,
        # auto picks graph only on CUDA (an unsupported family then falls back to hf and reports nothing).
        keeps_counters=setup.engine.backend == "graph" or (setup.engine.backend == "auto" and setup.device == "cuda"),
    )
    metrics = metrics_logger(config, run_dir, start_step)
    schedule = Schedule.from_config(config)
    privilege = builders.enabled_privileged_critic(config)
    ppo = config.ppo
    return Run(
        schedule=schedule,
        step_settings=builders.step_settings(config),
        source=source,
        generation=generation,
        validation=Validation(
            inputs.validation_rows[: ppo.max_val_samples],
            rollouts.validation,
            ppo.val_num_generations_per_prompt,
            generation.reseed,
        ),
        checkpoints=RunCheckpoints(
            resume.manager, config, workers.policy, workers.value, source, resume_from=resume.checkpoint
        ),
        metrics=metrics,
        records=StepRecords(
            run_dir,
            schedule,
            setup.tokenizer,
            metrics,
            ppo.num_generations_per_prompt,
            turn_level_credit=ppo.adv_estimator.name == "turn_gae",
        ),
        perf=perf,
        pad_token_id=setup.pad_token_id,
        critic_view=None if privilege is None else PrivilegedCritic(setup.tokenizer, privilege, setup.pad_token_id),
        owned=OwnedResources(source, metrics, gym, workers),
    )
