"""Where a run's trajectories come from: its data, its rollout functions and its batch source.

`trainer/run.py` (build_run) calls these; the gym's rollout functions come from `trainer/gym_setup.py`.

    data.train_path / validation_path --load_data--> rows --PromptStream--> batch_source --> driver
    reward-function rollouts (single_turn_rollouts) | gym rollouts --RolloutFunctions--> batch source / validation
"""

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from asyncppo.config import ConfigError, RunConfig
from asyncppo.data.prompt_stream import PromptStream
from asyncppo.data.rows import MissingPromptFieldError, load_gym_rows, load_rows, split_rows
from asyncppo.generation.protocol import SamplingParams, SupportsGenerate
from asyncppo.pipeline.async_source import build_async_source
from asyncppo.pipeline.dynamic_sampling import DynamicSampling
from asyncppo.pipeline.failures import StepFailureBudget
from asyncppo.pipeline.sources import BatchSource, GroupRolloutFn, SyncBatchSource, strict_group_rollouts
from asyncppo.rollout.rewards import RewardFunction
from asyncppo.rollout.single_turn import run_single_turn_rollouts
from asyncppo.trainer import builders
from asyncppo.trainer.ppo_step import group_training_rewards
from asyncppo.types import Trajectory
from asyncppo.workers.generator_group import GeneratorGroup

FAILURE_BUDGET_KEY = "env.gym.max_failed_groups_per_step"
ValidationRolloutFn = Callable[[Sequence[dict[str, Any]], int], tuple[list[Trajectory], int]]
"""(validation rows, generations per row) -> (trajectories, number of failed prompt groups)."""


@dataclass(frozen=True)
class RolloutFunctions:
    """How a run gets trajectories: the batch source's rollout (sync or async) and validation's; and the step's
    failure budget (the gym's env.gym.max_failed_groups_per_step; 0 for reward-function rollouts, whose
    failures are engine errors that end the run)."""

    train: GroupRolloutFn
    validation: ValidationRolloutFn
    failure_budget: StepFailureBudget


def single_turn_rollouts(
    config: RunConfig, generator: SupportsGenerate, tokenizer: Any, eos: tuple[int, ...], reward_fn: RewardFunction
) -> RolloutFunctions:
    """Reward-function rollouts: one generation per sample from the row's prompt, scored by `reward_fn` (the
    function env.reward_function names, loaded and checked by the pre-flight)."""
    max_prompt_tokens = config.data.max_input_seq_length or (
        config.model.max_total_sequence_length - config.generation.max_new_tokens
    )
    train_profile = builders.train_sampling(config, eos)
    validation_profile = builders.validation_sampling(config, eos)

    def rollout(
        rows: Sequence[dict[str, Any]], group_id_start: int, sampling: SamplingParams, generations: int
    ) -> list[Trajectory]:
        return run_single_turn_rollouts(
            generator,
            tokenizer,
            rows,
            num_generations_per_prompt=generations,
            sampling=sampling,
            reward_fn=reward_fn,
            group_id_start=group_id_start,
            system_prompt=config.data.system_prompt,
            prompt_key="prompt",
            messages_key="messages",
            max_prompt_tokens=max_prompt_tokens,
            max_new_tokens_key=config.data.max_new_tokens_key,
        )

    generations = config.ppo.num_generations_per_prompt

    def train(rows: Sequence[dict[str, Any]], group_id_start: int) -> list[Trajectory]:
        return rollout(rows, group_id_start, train_profile, generations)

    def validation(rows: Sequence[dict[str, Any]], num_generations: int) -> tuple[list[Trajectory], int]:
        return rollout(rows, 0, validation_profile, num_generations), 0

    return RolloutFunctions(strict_group_rollouts(train), validation, StepFailureBudget(0, FAILURE_BUDGET_KEY))


def batch_source(
    config: RunConfig,
    rows: list[dict[str, Any]],
    rollouts: RolloutFunctions,
    generator: GeneratorGroup,
    start_step: int,
) -> BatchSource:
    """Sync: generate each step's batch on demand, reseeding the generators per step. Async: a collector runs
    ahead into a trajectory buffer."""
    ppo = config.ppo
    settings = ppo.async_ppo
    # The async collector cycles epochs itself (async PPO is bounded by max_num_steps only, as in the seed).
    max_epochs = None if settings.enabled else ppo.max_num_epochs
    stream = PromptStream(
        rows, batch_size=ppo.num_prompts_per_step, seed=ppo.seed, shuffle=config.data.shuffle, max_epochs=max_epochs
    )
    if not settings.enabled:
        return SyncBatchSource(
            stream,
            rollouts.train,
            num_prompts_per_step=ppo.num_prompts_per_step,
            failure_budget=rollouts.failure_budget,
            reseed=generator.reseed,
            dynamic_sampling=dynamic_sampling(config),
        )
    return build_async_source(
        stream,
        rollouts.train,
        settings,
        num_prompts_per_step=ppo.num_prompts_per_step,
        start_step=start_step,
        policy_training_start_step=ppo.policy_training_start_step,
        failure_budget=rollouts.failure_budget,
    )


def dynamic_sampling(config: RunConfig) -> DynamicSampling | None:
    """ppo.use_dynamic_sampling's settings, filtering on the rewards the step trains on; None when it is off."""
    ppo = config.ppo
    if not ppo.use_dynamic_sampling:
        return None
    return DynamicSampling(
        batch_multiplier=ppo.batch_multiplier,
        max_gen_batches=ppo.dynamic_sampling_max_gen_batches,
        group_rewards=functools.partial(group_training_rewards, builders.step_settings(config)),
    )


def load_data(config: RunConfig) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(train rows, validation rows) of data.train_path and data.validation_path (else split off the training
    rows); a missing, empty or malformed file, or a row without the prompt field, is a ConfigError naming the key.

    Relative paths resolve from the working directory (the process's, not the config file's).
    """
    data = config.data

    def load(key: str, path: str) -> list[dict[str, Any]]:
        if not Path(path).exists():
            raise ConfigError(
                [
                    f"{key}: {path!r} does not exist (relative paths resolve from the working directory {Path.cwd()}); "
                    "give the path of a .jsonl file or of a datasets save_to_disk directory"
                ]
            )
        try:
            if config.env.should_use_nemo_gym:
                rows = load_gym_rows(path)
            else:
                rows = load_rows(path, prompt_key=data.prompt_key, messages_key=data.messages_key)
        except MissingPromptFieldError as error:
            raise ConfigError(
                [
                    f"data.prompt_key: {error.where} has neither the prompt field {data.prompt_key!r} "
                    f"(data.prompt_key) nor the chat field {data.messages_key!r} (data.messages_key), only "
                    f"{error.fields}; set data.prompt_key or data.messages_key to the field that holds the prompt"
                ]
            ) from None
        except (ValueError, OSError) as error:
            raise ConfigError([f"{key}: {error}; fix the file or point {key} at another"]) from None
        if not rows:
            raise ConfigError([f"{key}: {path} holds no rows; expected one JSON object per line (with a prompt field)"])
        return rows

    rows = load("data.train_path", data.train_path)
    if data.validation_path is not None:
        return rows, load("data.validation_path", data.validation_path)
    try:
        return split_rows(rows, data.validation_fraction, config.ppo.seed)
    except ValueError as error:
        raise ConfigError([f"data.validation_fraction: {error}; lower it or add training rows"]) from None
