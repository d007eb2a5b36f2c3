"""Offline critic pretraining, part 1: rollouts of the config's policy written as shards (`asyncppo critic collect`).

    RunSetup (training rows) --PromptStream--> SyncBatchSource --next_batch(N)--> shard N (+ source state N)
    rollouts: single-turn (reward function) or gym (policy server + agents), with the trainer's own rollout
              functions, on ONE generation engine in this process (no Ray: nothing trains while collecting)

<run_dir>/critic_data/ holds shard_NNNNN.jsonl (`rollout/shards.py`), source_NNNNN.pt (the batch source's state
after shard N) and config.yaml. A rerun continues after the last complete shard from its source state; shard N
samples with seed ppo.seed + 7919 N, so a resumed collection writes what an uninterrupted one would. Gym
rollouts are retried by the gym client, and failed groups replaced within env.gym.max_failed_groups_per_step (reward
function rollouts: ppo.max_failed_groups_per_step).
"""

import os
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from asyncppo.checkpoint import load_state, save_state
from asyncppo.config import ConfigError, dump_config
from asyncppo.data.prompt_stream import PromptStream
from asyncppo.generation.protocol import GenerationRequest, GenerationResult
from asyncppo.pipeline.sources import SyncBatchSource
from asyncppo.rollout.shards import complete_shard_indices, shard_path, write_shard
from asyncppo.trainer.generation_side import SEED_STRIDE
from asyncppo.trainer.run_inputs import start_rollouts
from asyncppo.trainer.setup import RunSetup
from asyncppo.workers.generator_worker import GeneratorWorker, load_generator_worker

if TYPE_CHECKING:  # the gym's HTTP stack is imported only by collections that use the gym
    from asyncppo.trainer.gym_setup import GymRollouts
    from asyncppo.workers.policy_http import PolicyServerSettings

CRITIC_DATA_DIR = "critic_data"
SOURCE_STATE_NAME = "source_{index:05d}.pt"


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

    def policy_requests_received(self) -> int:
        return self.worker.policy_requests_received()

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


def collect_shards(setup: RunSetup, run_dir: Path, *, num_shards: int | None = None) -> list[Path]:
    """Write shards until `num_shards` (default critic_pretrain.num_shards) are complete; returns every shard path.

    `setup` comes from resolve_setup(config, data=True): its training rows are the prompts drawn.
    """
    config = setup.config
    target = num_shards if num_shards is not None else config.critic_pretrain.num_shards
    directory = run_dir / CRITIC_DATA_DIR
    done = completed_shards(directory)
    if len(done) >= target:
        print(f"{directory}: {len(done)} complete shards, {target} asked for; nothing to collect", flush=True)
        return [shard_path(directory, index) for index in range(len(done))]
    train_rows = setup.checked_inputs.train_rows
    prompts_per_shard = config.critic_pretrain.prompts_per_shard
    if prompts_per_shard > len(train_rows):
        raise ConfigError(
            [
                f"critic_pretrain.prompts_per_shard: {prompts_per_shard} exceeds the {len(train_rows)} "
                "training rows; lower it"
            ]
        )
    if config.env.should_use_nemo_gym:  # an external gym's URLs answer, or the collection stops before it starts
        from asyncppo.trainer.gym_setup import wait_for_external_gym

        wait_for_external_gym(config)
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.yaml").write_text(dump_config(config))
    worker = load_generator_worker(str(setup.paths.policy), setup.dtype, setup.device, setup.engine, rank=0)
    generator = InProcessGenerator(worker)
    gym: GymRollouts | None = None
    try:
        # The policy is never updated here: every rollout is generated by version 0.
        rollouts, gym = start_rollouts(setup, generator, lambda: 0, None)
        seed = config.ppo.seed
        stream = PromptStream(train_rows, batch_size=prompts_per_shard, seed=seed, shuffle=config.data.shuffle)
        source = SyncBatchSource(
            stream,
            rollouts.train,
            num_prompts_per_step=prompts_per_shard,
            failure_budget=rollouts.failure_budget,
            reseed=generator.reseed,
        )
        if done:
            source.load_state_dict(load_state(source_state_path(directory, done[-1])))
            print(f"{directory}: resuming after shard {done[-1]}", flush=True)
        for index in range(len(done), target):
            _write_next_shard(source, directory, index, seed)
    finally:
        try:
            if gym is not None:
                gym.close()
        finally:
            generator.close()
    return [shard_path(directory, index) for index in range(target)]


def _write_next_shard(source: SyncBatchSource, directory: Path, index: int, seed: int) -> None:
    """Shard `index`, sampled with seed `seed` + SEED_STRIDE * index, after the source state it ends in."""
    source.reseed_generation(seed + SEED_STRIDE * index)
    batch = source.next_batch(index)
    # The state first: a shard that exists always has the state to continue after it.
    _save_state_atomically(source_state_path(directory, index), source.state_dict())
    path = write_shard(directory, index, batch.trajectories)
    rewards = [trajectory.reward for trajectory in batch.trajectories]
    print(
        f"shard {index}: {len(rewards)} rollouts of {batch.num_prompts} prompts, reward mean "
        f"{sum(rewards) / len(rewards):.3f}, failed groups {batch.metrics['rollout/failed_groups']:.0f} -> {path}",
        flush=True,
    )
