"""The driver loop of a training run (`asyncppo train` calls it; so do scripts and integration tests).

    build_run -> restore -> [validate] -> for each step: batch = source.next_batch(step)
                                                         [privileged critic prefixes from the trajectories]
                                                         ppo_step(batch) + reward/<component> means
                                                         -> publish weights (version step+1)
                                                         validate every val_period
                                                         [rollout dump] [train data records] -> log
                                                         print the books every log_every steps -> checkpoint
                                                         stop requested (a signal) -> checkpoint -> return
One loop for sync and async PPO: they differ only in the batch source (pipeline/sources.py), which also
wraps each weight update (the async collector drains or pauses around it), reseeds sampling where that makes
runs reproducible, and keeps the books of every prompt drawn.
"""

import time
from collections.abc import Callable, Sequence

from asyncppo.algorithms.mismatch import mismatch_plot_data
from asyncppo.metrics.train_data import train_data_path, train_data_records, write_train_data
from asyncppo.pipeline.time_tally import driver_idle_breakdown
from asyncppo.rollout.reward_components import reward_component_metrics
from asyncppo.trainer.ppo_step import StepOutput, ppo_step
from asyncppo.trainer.run import Run
from asyncppo.types import Trajectory, collate_trajectories


def _never() -> bool:
    return False


def train(run: Run, stop_requested: Callable[[], bool] = _never) -> int:
    """The loop: steps from the restored step to ppo.max_num_steps, validating and saving on schedule.

    `stop_requested` is asked between steps (the step in progress always runs to its end, so every checkpoint
    holds the state after a completed step): once it answers True the loop saves the last completed step, when
    checkpointing is on and that checkpoint is not already written, and returns. Returns the number of
    completed steps (the restored step when none ran).
    """
    ppo = run.config.ppo
    deadline = run.config.checkpointing.must_save_by_seconds
    run_started = time.monotonic()
    start = run.restore()
    run.publish_policy(version=start, trained=True)  # generators start from the trainer's exact weights
    policy_has_trained = start > ppo.policy_training_start_step
    if ppo.val_at_start and start == 0:
        # Read the engine counters here too, so the start's validation prefill is not booked on step 1.
        run.metrics.log(0, {**run.validate(0), **run.generation_metrics()})
    for step in range(start, ppo.max_num_steps):
        if stop_requested():  # before any step of this process ran: the restored checkpoint already holds it
            return step
        started = time.perf_counter()
        run.start_generation(step)
        step_batch = run.source.next_batch(step)
        generated = time.perf_counter()
        batch = collate_trajectories(step_batch.trajectories, run.pad_token_id)
        prefixes = run.critic_prefixes(step_batch.trajectories)  # privileged critic: None when off
        output = ppo_step(run.step_settings, run.policy, run.value, batch, step, critic_prefixes=prefixes)
        policy_has_trained = policy_has_trained or output.policy_trained
        metrics = {**step_batch.metrics, **output.metrics, **reward_component_metrics(step_batch.trajectories)}
        bubble_started = time.perf_counter()
        # Async: rollouts drain (or only pause, with in-flight updates) for the push, then the window moves;
        # always, also when the policy did not train (critic warm-up).
        with run.source.weight_update(step + 1):
            metrics.update(run.publish_policy(version=step + 1, trained=output.policy_trained))
        metrics["timing/sync_bubble"] = time.perf_counter() - bubble_started
        completed = step + 1
        if _due(ppo.val_period, completed) or (ppo.val_at_end and completed == ppo.max_num_steps):
            validation_started = time.perf_counter()
            metrics.update(run.validate(completed))
            metrics["timing/validation"] = time.perf_counter() - validation_started
        _plot_mismatch(run, output, completed, metrics)
        if ppo.log_rollout_dump and ppo.rollout_dump_period and completed % ppo.rollout_dump_period == 0:
            _dump_rollouts(run, output, completed, metrics)
        metrics["timing/generation"] = generated - started
        metrics["timing/step"] = time.perf_counter() - started
        metrics.update(run.perf.step_metrics(batch, metrics))  # MFU, padding, tokens/s: needs timing/step
        metrics.update(driver_idle_breakdown(metrics))  # async runs only
        if not run.config.env.should_log_nemo_gym_responses and _due(run.config.logger.train_data_period, completed):
            _write_train_data(run, step_batch.trajectories, output, completed)
        metrics.update(run.rollout_metrics())  # cumulative, so read last: validation's rollouts count too
        metrics.update(run.generation_metrics())  # since the last read: this step's validation counts too
        run.metrics.log(completed, metrics)
        if _accounting_due(ppo.async_ppo.log_every, completed):
            run.log_accounting(completed)
        out_of_time = deadline is not None and time.monotonic() - run_started >= deadline
        stopping = stop_requested()
        if run.config.checkpointing.enabled and (
            _due(run.config.checkpointing.save_period, completed)
            or completed == ppo.max_num_steps
            or out_of_time
            or stopping
        ):
            run.save(completed, metrics, policy_has_trained)
        if out_of_time:
            print(
                f"checkpointing.checkpoint_must_save_by reached after step {completed}: saved and stopped", flush=True
            )
            return completed
        if stopping:
            return completed  # the caller says why it stopped
    return max(start, ppo.max_num_steps)


def _due(period: int, completed: int) -> bool:
    return period > 0 and completed % period == 0


def _accounting_due(log_every: int | None, completed: int) -> bool:
    """ppo.async_ppo.log_every: every N steps, 0 never, null every step."""
    return log_every is None or _due(log_every, completed)


def _plot_mismatch(run: Run, output: StepOutput, step: int, metrics: dict[str, float]) -> None:
    """Save the worst sequence's logprob curves when the step's token_mult_prob_error passes the threshold."""
    error = metrics.get("mismatch/token_mult_prob_error")
    batch = output.batch
    if error is None or error <= run.config.logger.mismatch_plot_threshold or batch.old_logprobs is None:
        return
    data = mismatch_plot_data(batch.old_logprobs, batch.generation_logprobs, batch.token_mask)
    if data is None:
        return
    from asyncppo.metrics.plots import save_mismatch_plot

    path = save_mismatch_plot(data, run.run_dir / "plots" / f"mismatch_step_{step}.png", step)
    run.metrics.log_image(step, "mismatch/token_mult_prob_error_plot", path)


def _dump_rollouts(run: Run, output: StepOutput, step: int, metrics: dict[str, float]) -> None:
    """Per-token values, advantages and logprobs of the step, for offline analysis."""
    from asyncppo.metrics.rollout_dump import write_rollout_dump

    turn_mode = run.config.ppo.adv_estimator.name == "turn_gae"
    write_rollout_dump(
        run.run_dir / "rollout_dumps" / f"step_{step}.pt",
        step,
        output.batch,
        num_generations_per_prompt=run.config.ppo.num_generations_per_prompt,
        credit_level="turn" if turn_mode else "token",
        adv_raw_mean=metrics.get("adv_raw/mean", 0.0),
        adv_raw_std=metrics.get("adv_raw/std", 0.0),
        decode=run.decode,
        anchor_mask=output.batch.critic_mask if turn_mode else None,
    )


def _write_train_data(run: Run, trajectories: Sequence[Trajectory], output: StepOutput, step: int) -> None:
    """Every trained sample's texts, token counts, reward and mean advantage (train_data_step{N}.jsonl)."""
    records = train_data_records(
        step,
        output.batch,
        prompts=[run.decode(t.token_ids[: t.prompt_length]) for t in trajectories],
        responses=[run.decode(t.token_ids[t.prompt_length :]) for t in trajectories],
        reward_components=[t.reward_components for t in trajectories],
    )
    write_train_data(train_data_path(run.run_dir, step), records)
