"""The driver loop of a training run (`asyncppo train` calls it; so do `bench train`, scripts and integration tests).

    restore -> publish version = start -> [validate] -> for each step:
        batch = source.next_batch(step) -> [privileged critic prefixes] -> ppo_step (values, logprobs,
        reference logprobs, advantages, critic then policy updates) -> publish version step+1 inside the
        source's weight-update context -> [validate] [records] -> metrics (timing/*, perf/*) -> log
        -> [books] -> [checkpoint] -> stop requested or out of time: return
One loop for sync and async PPO: they differ only in the batch source (pipeline/sources.py), which also
wraps each weight update (the async collector drains or pauses around it), reseeds sampling where that makes
runs reproducible, and keeps the books of every prompt drawn. What happens when is `run.schedule`'s answer
(trainer/schedule.py); the loop reads no config key.
"""

import time
from collections.abc import Callable

from asyncppo.pipeline.time_tally import driver_idle_breakdown
from asyncppo.rollout.reward_components import reward_component_metrics
from asyncppo.trainer.ppo_step import ppo_step
from asyncppo.trainer.run import Run
from asyncppo.types import collate_trajectories
from asyncppo.workers.ray_host import WorkerDiedError


def _never() -> bool:
    return False


def train(run: Run, stop_requested: Callable[[], bool] = _never) -> int:
    """The loop: steps from the restored step to ppo.max_num_steps, validating and saving on schedule.

    `stop_requested` is asked between steps (the step in progress always runs to its end, so every checkpoint
    holds the state after a completed step): once it answers True the loop saves the last completed step, when
    checkpointing is on and that checkpoint is not already written, and returns. Returns the number of
    completed steps (the restored step when none ran).

    A worker process that dies ends the run with a WorkerDiedError naming its role, rank and the step (a dead
    generator is restarted instead, within generation.max_restarts: `run.generation` and the batch source see to
    it, and the loop lets it hand restarted generators the weights while it only waits for rollouts).
    """
    schedule = run.schedule
    loop_started = time.monotonic()
    in_progress = 1  # the step a worker death interrupts, counted from 1
    try:
        start = run.checkpoints.restore()
        in_progress = start + 1
        run.generation.publish(version=start, trained=True)  # generators start from the trainer's exact weights
        policy_has_trained = schedule.policy_has_trained(start)
        if schedule.validate_at_start(start):
            # Read the engine counters here too, so the start's validation prefill is not booked on step 1.
            run.metrics.log(0, {**_validate(run, 0), **run.generation.engine_metrics()})
        for step in range(start, schedule.max_num_steps):
            in_progress = step + 1
            if stop_requested():  # before any step of this process ran: the restored checkpoint already holds it
                return step
            metrics, policy_trained = train_step(run, step)
            policy_has_trained = policy_has_trained or policy_trained
            completed = step + 1
            run.metrics.log(completed, metrics)
            if schedule.accounting_after(completed):
                run.log_accounting(completed)
            out_of_time = schedule.out_of_time(time.monotonic() - loop_started)
            stopping = stop_requested()
            if schedule.checkpoint_after(completed, stopping=out_of_time or stopping):
                run.checkpoints.save(completed, metrics, policy_has_trained)
            if out_of_time:
                print(
                    f"checkpointing.checkpoint_must_save_by reached after step {completed}: saved and stopped",
                    flush=True,
                )
                return completed
            if stopping:
                return completed  # the caller says why it stopped
        return max(start, schedule.max_num_steps)
    except WorkerDiedError as died:
        raise died.at_step(in_progress) from None  # its one line is the whole story: no traceback to chain


def _validate(run: Run, step: int) -> dict[str, float]:
    """val/* metrics; the trainer only waits for rollouts meanwhile (see GenerationSide.trainer_idle)."""
    with run.generation.trainer_idle():
        return run.validation.run(step)


def train_step(run: Run, step: int) -> tuple[dict[str, float], bool]:
    """One step, from its batch to its metrics (validation and records included when due); returns (the step's
    metrics, whether the policy trained)."""
    started = time.perf_counter()
    run.generation.reseed(step)
    with run.generation.trainer_idle():  # a generator restarted meanwhile may get the published weights now
        step_batch = run.source.next_batch(step)
    generated = time.perf_counter()
    batch = collate_trajectories(step_batch.trajectories, run.pad_token_id)
    prefixes = run.critic_prefixes(step_batch.trajectories)  # privileged critic: None when off
    workers = run.workers
    output = ppo_step(run.step_settings, workers.policy, workers.value, batch, step, critic_prefixes=prefixes)
    metrics = {**step_batch.metrics, **output.metrics, **reward_component_metrics(step_batch.trajectories)}
    bubble_started = time.perf_counter()
    # Async: rollouts drain (or only pause, with in-flight updates) for the push, then the window moves;
    # always, also when the policy did not train (critic warm-up).
    with run.source.weight_update(step + 1):
        metrics.update(run.generation.publish(version=step + 1, trained=output.policy_trained))
    metrics["timing/sync_bubble"] = time.perf_counter() - bubble_started
    completed = step + 1
    if run.schedule.validate_after(completed):
        validation_started = time.perf_counter()
        metrics.update(_validate(run, completed))
        metrics["timing/validation"] = time.perf_counter() - validation_started
    run.records.write(completed, output, step_batch.trajectories, metrics)
    metrics["timing/generation"] = generated - started
    metrics["timing/step"] = time.perf_counter() - started
    metrics.update(run.perf.step_metrics(batch, metrics))  # MFU, padding, tokens/s: needs timing/step
    metrics.update(driver_idle_breakdown(metrics))  # async runs only
    metrics.update(run.rollout_metrics())  # cumulative, so read last: validation's rollouts count too
    metrics.update(run.generation.engine_metrics())  # since the last read: this step's validation counts too
    return metrics, output.policy_trained
