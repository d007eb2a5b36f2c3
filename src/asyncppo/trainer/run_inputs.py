"""Where a run's trajectories come from: its data, its rollout functions and its batch source.

`trainer/build.py` (start_run) and `trainer/critic_collection.py` call these; the gym's rollout functions come
from `trainer/gym_setup.py`.

    RunSetup.rollout_kind --start_rollouts--> single_turn_rollouts (reward function) | gym rollouts
        --RolloutFunctions--> batch source (train) / validation
    training rows (RunSetup.inputs) --PromptStream--> batch_source (sync, or async with its collector) --> driver
"""

import functools
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from asyncppo.config import RunConfig
from asyncppo.data.prompt_files import prompt_texts
from asyncppo.data.prompt_stream import PromptStream
from asyncppo.generation.protocol import SamplingParams, SupportsGenerate
from asyncppo.pipeline.async_source import build_async_source
from asyncppo.pipeline.dynamic_sampling import DynamicSampling
from asyncppo.pipeline.failures import StepFailureBudget
from asyncppo.pipeline.sources import BatchSource, GenerationHealth, GroupOutcome, GroupRolloutFn, SyncBatchSource
from asyncppo.rollout.rewards import RewardFunction, RewardFunctionError
from asyncppo.rollout.single_turn import run_single_turn_groups
from asyncppo.trainer import builders
from asyncppo.trainer.ppo_step import group_training_rewards
from asyncppo.trainer.setup import RunSetup
from asyncppo.types import Trajectory

if TYPE_CHECKING:
    from asyncppo.trainer.gym_setup import GymRollouts, RolloutGenerators

log = logging.getLogger(__name__)

GYM_FAILURE_BUDGET_KEY = "env.gym.max_failed_groups_per_step"
REWARD_FAILURE_BUDGET_KEY = "ppo.max_failed_groups_per_step"
ValidationRolloutFn = Callable[[Sequence[dict[str, Any]], int], tuple[list[Trajectory], int]]
"""(validation rows, generations per row) -> (trajectories, number of failed prompt groups)."""


@dataclass(frozen=True)
class RolloutFunctions:
    """How a run gets trajectories: the batch source's rollout (sync or async) and validation's; and the step's
    failure budget, under the key that sets it for the run's rollout kind (gym: env.gym.max_failed_groups_per_step;
    reward function: ppo.max_failed_groups_per_step)."""

    train: GroupRolloutFn
    validation: ValidationRolloutFn
    failure_budget: StepFailureBudget


def single_turn_rollouts(setup: RunSetup, generator: SupportsGenerate, reward_fn: RewardFunction) -> RolloutFunctions:
    """Reward-function rollouts: one generation per sample from the row's prompt (plain-text prompts with the
    system prompt and the prompt template of the data section, which the pre-flight checked), scored by
    `reward_fn` (the function env.reward_function names, loaded and checked by the pre-flight) under the deadline
    env.reward_timeout_s. A group whose reward function fails is that group's failure, replaced within
    ppo.max_failed_groups_per_step per step; validation skips and counts up to as many failed groups."""
    config, tokenizer = setup.config, setup.tokenizer
    texts = prompt_texts(config.data, gym=False)  # data.system_prompt(_file), data.prompt_file
    max_prompt_tokens = config.data.max_input_seq_length or (
        config.model.max_total_sequence_length - config.generation.max_new_tokens
    )
    train_profile = builders.train_sampling(config, setup.eos_token_ids)
    validation_profile = builders.validation_sampling(config, setup.eos_token_ids)
    budget = StepFailureBudget(config.ppo.max_failed_groups_per_step, REWARD_FAILURE_BUDGET_KEY)

    def rollout(
        rows: Sequence[dict[str, Any]], group_id_start: int, sampling: SamplingParams, generations: int, max_failed: int
    ) -> list[GroupOutcome]:
        return run_single_turn_groups(
            generator,
            tokenizer,
            rows,
            num_generations_per_prompt=generations,
            sampling=sampling,
            reward_fn=reward_fn,
            group_id_start=group_id_start,
            system_prompt=texts.system_prompt,
            prompt_template=texts.prompt_template,
            prompt_key="prompt",
            messages_key="messages",
            max_prompt_tokens=max_prompt_tokens,
            max_new_tokens_key=config.data.max_new_tokens_key,
            reward_timeout_s=config.env.reward_timeout_s,
            max_failed_groups=max_failed,
        )

    generations = config.ppo.num_generations_per_prompt

    def train(rows: Sequence[dict[str, Any]], group_ids: Sequence[int]) -> list[GroupOutcome]:
        first = group_ids[0]
        if list(group_ids) != list(range(first, first + len(group_ids))):
            raise ValueError(f"single-turn rollouts need consecutive group ids, got {list(group_ids)}")
        # Scoring stops past what is left of the step's budget: the source stops the run at the next failure anyway.
        return rollout(rows, first, train_profile, generations, budget.remaining)

    def validation(rows: Sequence[dict[str, Any]], num_generations: int) -> tuple[list[Trajectory], int]:
        outcomes = rollout(rows, 0, validation_profile, num_generations, budget.max_failures)
        return validation_groups(outcomes, budget)

    return RolloutFunctions(train, validation, budget)


def validation_groups(outcomes: Sequence[GroupOutcome], budget: StepFailureBudget) -> tuple[list[Trajectory], int]:
    """(the trajectories of the groups that succeeded, the number that failed) of one validation; a RewardFunctionError
    naming the budget's key and the last failure when more groups failed than the budget allows."""
    failures = [outcome for outcome in outcomes if isinstance(outcome, RewardFunctionError)]
    if len(failures) > budget.max_failures:
        raise RewardFunctionError(
            f"validation: {len(failures)} prompt groups failed, more than {budget.budget_key}={budget.max_failures}; "
            f"last failure: {failures[-1]}"
        ) from failures[-1]
    for failure in failures[:3]:
        log.warning("validation: a prompt group failed and is skipped: %s", failure)
    # Groups are left unscored (UnscoredGroupError) only past the budget, which raised above.
    assert sum(isinstance(outcome, Exception) for outcome in outcomes) == len(failures)
    trajectories = [t for outcome in outcomes if not isinstance(outcome, Exception) for t in outcome]
    return trajectories, len(failures)


def start_rollouts(
    setup: RunSetup,
    generator: "RolloutGenerators",
    policy_version: Callable[[], int],
    gym_results_log: Path | None,
) -> tuple[RolloutFunctions, "GymRollouts | None"]:
    """The run's rollout functions, of its rollout kind: the gym's (its servers started over `generator`; the
    second value, to close) or the reward function's (nothing to close). `policy_version` stamps gym
    trajectories; `gym_results_log` records every gym result when set."""
    if setup.rollout_kind == "single_turn":
        reward_fn = setup.checked_inputs.reward_function
        assert reward_fn is not None, "the pre-flight loads it for every run without the gym"
        return single_turn_rollouts(setup, generator, reward_fn), None
    # Imported here: the gym's HTTP stack (fastapi, uvicorn, httpx) loads only in runs that use the gym.
    from asyncppo.trainer.gym_setup import start_gym_rollouts

    gym = start_gym_rollouts(setup, generator, policy_version, gym_results_log)
    config = setup.config
    budget = StepFailureBudget(config.env.gym.max_failed_groups_per_step, GYM_FAILURE_BUDGET_KEY)
    return RolloutFunctions(gym.rollout(config.ppo.num_generations_per_prompt), gym.validation, budget), gym


def batch_source(
    config: RunConfig,
    rows: list[dict[str, Any]],
    rollouts: RolloutFunctions,
    reseed: Callable[[int], None],
    start_step: int,
    health: GenerationHealth | None = None,
) -> BatchSource:
    """Sync: generate each step's batch on demand, reseeding the generators per step. Async: a collector runs
    ahead into a trajectory buffer. `health`: the generators' (their supervisor), so that rollouts a generator's
    death cost run again; None when generation is colocated."""
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
            reseed=reseed,
            dynamic_sampling=dynamic_sampling(config),
            health=health,
        )
    return build_async_source(
        stream,
        rollouts.train,
        settings,
        num_prompts_per_step=ppo.num_prompts_per_step,
        start_step=start_step,
        policy_training_start_step=ppo.policy_training_start_step,
        failure_budget=rollouts.failure_budget,
        health=health,
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
