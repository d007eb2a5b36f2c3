"""Offline critic pretraining, part 1: rollouts of the config's policy written as shards (`asyncppo critic collect`).

    config --preflight--> train rows --PromptStream--> SyncBatchSource --next_batch(N)--> shard N (+ source state N)
    rollouts: single-turn (reward function) or gym (policy server + agents), with the trainer's own rollout
              functions, on ONE generation engine in this process (no Ray: nothing trains while collecting)

<run_dir>/critic_data/ holds shard_NNNNN.jsonl (`rollout/shards.py`), source_NNNNN.pt (the batch source's state
after shard N) and config.yaml. A rerun continues after the last complete shard from its source state; shard N
samples with seed ppo.seed + 7919 N, so a resumed collection writes what an uninterrupted one would. Gym
rollouts are retried by the gym client, and failed groups replaced within env.gym.max_failed_groups_per_step.
"""

import os
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from asyncppo.checkpoint import load_state, save_state
from asyncppo.config import ConfigError, RunConfig, dump_config
from asyncppo.data.prompt_stream import PromptStream
from asyncppo.generation.protocol import GenerationRequest, GenerationResult
from asyncppo.models.tokenizer import load_tokenizer
from asyncppo.pipeline.failures import StepFailureBudget
from asyncppo.pipeline.sources import GroupRolloutFn, SyncBatchSource
from asyncppo.rollout.shards import complete_shard_indices, shard_path, write_shard
from asyncppo.trainer import builders
from asyncppo.trainer.preflight import preflight
from asyncppo.trainer.run_inputs import FAILURE_BUDGET_KEY, single_turn_rollouts
from asyncppo.workers.generator_worker import GeneratorWorker, load_generator_worker

if TYPE_CHECKING:  # the gym's HTTP stack is imported only by collections that use the gym
    from asyncppo.trainer.gym_setup import GymRollouts
    from asyncppo.workers.policy_http import PolicyServerSettings

CRITIC_DATA_DIR = "critic_data"
SOURCE_STATE_NAME = "source_{index:05d}.pt"
SHARD_SEED_STRIDE = 7919


class InProcessGenerator:
    """One GeneratorWorker in this process, answering what the rollout functions ask of the run's generator group."""

    def __init__(self, worker: GeneratorWorker) -> None:
        self.worker = worker

    def generate(self, requests: Sequence[GenerationRequest]) -> list[GenerationResult]:
        return self.worker.generate(requests)

    def reseed(self, seed: int) -> None:
        self.worker.reseed(seed)

    def serve_http(self, settings: "PolicyServerSettings") -> list[str]:
        return [self.worker.serve_http(settings)]

    def close(self) -> None:
        self.worker.close()


def source_state_path(directory: Path, index: int) -> Path:
    return directory / SOURCE_STATE_NAME.format(index=index)


def _save_state_atomically(path: Path, state: dict[str, object]) -> None:
    temporary = path.with_name(path.name + ".tmp")
    save_state(temporary, state)
    os.replace(temporary, path)


def completed_shards(directory: Path) -> list[int]:
    """Indices of the complete shards, which must be 0..N-1 each with its source state (else a ConfigError)."""
    done = complete_shard_indices(directory)
    if done != list(range(len(done))):
        raise ConfigError([f"{directory}: shards {done} are not numbered 0..{len(done) - 1}; remove the stray ones"])
    if done and not source_state_path(directory, done[-1]).is_file():
        raise ConfigError([f"{directory}: shard {done[-1]} has no {SOURCE_STATE_NAME.format(index=done[-1])}"])
    return done


def collect_shards(
    config: RunConfig, run_dir: Path, *, num_shards: int | None = None, config_dir: Path | None = None
) -> list[Path]:
    """Write shards until `num_shards` (default critic_pretrain.num_shards) are complete; returns every shard path."""
    target = num_shards if num_shards is not None else config.critic_pretrain.num_shards
    directory = run_dir / CRITIC_DATA_DIR
    done = completed_shards(directory)
    if len(done) >= target:
        print(f"{directory}: {len(done)} complete shards, {target} asked for; nothing to collect", flush=True)
        return [shard_path(directory, index) for index in range(len(done))]
    checked = preflight(config, config_dir)
    if config.env.should_use_nemo_gym and config.env.gym.launch == "builtin":
        from asyncppo.trainer.gym_setup import check_builtin_resources

        check_builtin_resources(config.env.gym.resources)
    prompts_per_shard = config.critic_pretrain.prompts_per_shard
    if prompts_per_shard > len(checked.train_rows):
        raise ConfigError(
            [
                f"critic_pretrain.prompts_per_shard: {prompts_per_shard} exceeds the {len(checked.train_rows)} "
                "training rows; lower it"
            ]
        )
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.yaml").write_text(dump_config(config))

    paths = builders.ModelPaths.resolve(config)
    tokenizer = load_tokenizer(paths.tokenizer)
    eos, pad = builders.end_and_pad_ids(config, tokenizer, paths.tokenizer)
    engine = builders.engine_settings(config, eos, pad)
    device = builders.resolve_device(config)
    dtype = builders.DTYPES[config.model.precision]
    generator = InProcessGenerator(load_generator_worker(str(paths.policy), dtype, device, engine, rank=0))
    gym: GymRollouts | None = None
    try:
        if config.env.should_use_nemo_gym:
            from asyncppo.trainer.gym_setup import start_gym_rollouts

            # The policy is never updated here: every rollout is generated by version 0.
            gym = start_gym_rollouts(config, generator, tokenizer, str(paths.tokenizer), lambda: 0, None)
            rollout: GroupRolloutFn = gym.rollout(config.ppo.num_generations_per_prompt)
            budget = StepFailureBudget(config.env.gym.max_failed_groups_per_step, FAILURE_BUDGET_KEY)
        else:
            assert checked.reward_function is not None, "preflight loads it for every run without the gym"
            rollouts = single_turn_rollouts(config, generator, tokenizer, eos, checked.reward_function)
            rollout, budget = rollouts.train, rollouts.failure_budget
        stream = PromptStream(
            checked.train_rows, batch_size=prompts_per_shard, seed=config.ppo.seed, shuffle=config.data.shuffle
        )
        source = SyncBatchSource(
            stream, rollout, num_prompts_per_step=prompts_per_shard, failure_budget=budget, reseed=generator.reseed
        )
        if done:
            source.load_state_dict(load_state(source_state_path(directory, done[-1])))
            print(f"{directory}: resuming after shard {done[-1]}", flush=True)
        for index in range(len(done), target):
            source.reseed_generation(config.ppo.seed + SHARD_SEED_STRIDE * index)
            batch = source.next_batch(index)
            # The state first: a shard that exists always has the state to continue after it.
            _save_state_atomically(source_state_path(directory, index), source.state_dict())
            path = write_shard(directory, index, batch.trajectories)
            rewards = [trajectory.reward for trajectory in batch.trajectories]
            print(
                f"shard {index}: {len(rewards)} rollouts of {batch.num_prompts} prompts, reward mean "
                f"{sum(rewards) / len(rewards):.3f}, failed groups {batch.metrics['rollout/failed_groups']:.0f} "
                f"-> {path}",
                flush=True,
            )
    finally:
        try:
            if gym is not None:
                gym.close()
        finally:
            generator.close()
    return [shard_path(directory, index) for index in range(target)]
