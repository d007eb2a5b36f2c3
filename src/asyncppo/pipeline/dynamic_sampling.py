"""DAPO dynamic sampling for sync runs: train only on prompt groups whose rewards differ.

A group whose rollouts all got the same reward has zero advantage under a group baseline and mostly teaches the
critic what it already knows; DAPO drops such groups and generates more until the step is full:

    generation batch (num_prompts_per_step * batch_multiplier prompts) --rewards--> keep groups with spread
        kept groups accumulate over generation batches --(>= num_prompts_per_step)--> step trains on the first
        num_prompts_per_step, in draw order; the rest are dropped
    after max_gen_batches batches still short --> DynamicSamplingError naming the step

The rewards tested are those the step trains on (`GroupRewards`: the trajectory reward, with any gym penalties
already in it, after reward scaling and overlong shaping). "Zero std" is tested as max == min, so float rounding
in a standard deviation cannot keep a group whose rewards are all equal.

Books: every draw id ends trained or dropped with a reason: failed rollouts as before, `ZERO_REWARD_STD` for the
filtered groups, `UNUSED_KEPT_GROUP` for kept groups the step did not need (or could not use, when it stopped at
the cap or on an error). Kept groups never outlive their step (the seed discards its cache once a step is full),
so a checkpoint, taken between steps, holds no cache and resumes losslessly.
"""

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from asyncppo.pipeline.errors import step_number
from asyncppo.pipeline.ledger import AccountingLedger
from asyncppo.types import Trajectory

ZERO_REWARD_STD = "zero_reward_std"
"""Ledger reason: dynamic sampling filtered the group out (all its rewards equal)."""
UNUSED_KEPT_GROUP = "dynamic_sampling_unused"
"""Ledger reason: the group passed the filter but its step did not train it (surplus, or the step stopped)."""

Group = list[Trajectory]
GroupRewards = Callable[[Sequence[Trajectory]], Sequence[float]]
"""One group's trajectories -> the rewards the step would train on, one per trajectory, in order."""
GenerateGroups = Callable[[int], list[Group]]
"""count -> that many successfully rolled-out groups of freshly drawn prompts (failures already replaced)."""


@dataclass(frozen=True)
class DynamicSampling:
    """ppo.use_dynamic_sampling's settings, as plain values (built by the trainer)."""

    batch_multiplier: int
    """Prompts per generation batch, in multiples of num_prompts_per_step."""
    max_gen_batches: int
    """Generation batches one step may draw before DynamicSamplingError."""
    group_rewards: GroupRewards


class DynamicSamplingError(RuntimeError):
    """A step stayed short of varied groups after the allowed generation batches."""


def has_reward_spread(rewards: Sequence[float]) -> bool:
    """Non-zero standard deviation, tested exactly: not every reward is equal."""
    if not rewards:
        raise ValueError("a prompt group with no trajectories has no reward spread to test")
    return max(rewards) != min(rewards)


def fill_with_varied_groups(
    step: int,
    num_prompts: int,
    sampling: DynamicSampling,
    generate: GenerateGroups,
    ledger: AccountingLedger,
) -> tuple[list[Group], dict[str, float]]:
    """The step's `num_prompts` groups with reward spread, generated batch after batch, and the step's
    dynamic_sampling/* metrics. Records filtered and unused groups as dropped in `ledger` (the caller records
    the returned groups as trained). Raises DynamicSamplingError past `sampling.max_gen_batches` batches."""
    batch_size = num_prompts * sampling.batch_multiplier
    kept: list[Group] = []
    generated_rewards: list[float] = []
    num_batches = filtered = 0
    try:
        while len(kept) < num_prompts:
            if num_batches == sampling.max_gen_batches:
                raise DynamicSamplingError(_cap_message(step, num_batches, len(kept), num_prompts, sampling))
            num_batches += 1
            for group in generate(batch_size):
                rewards = list(sampling.group_rewards(group))
                generated_rewards += rewards
                if has_reward_spread(rewards):
                    kept.append(group)
                else:
                    ledger.record_dropped([group[0].group_id], ZERO_REWARD_STD)
                    filtered += 1
    except Exception:
        # The step ends here, and with it the run: the groups kept so far are never trained, and the books say so.
        ledger.record_dropped((group[0].group_id for group in kept), UNUSED_KEPT_GROUP)
        raise
    surplus = kept[num_prompts:]
    ledger.record_dropped((group[0].group_id for group in surplus), UNUSED_KEPT_GROUP)
    generated = num_batches * batch_size
    metrics = {
        "dynamic_sampling/num_gen_batches": float(num_batches),
        "dynamic_sampling/kept_fraction": len(kept) / generated,
        "dynamic_sampling/filtered_groups": float(filtered),
        "dynamic_sampling/surplus_groups": float(len(surplus)),
        "dynamic_sampling/generated_reward_mean": sum(generated_rewards) / len(generated_rewards),
    }
    return kept[:num_prompts], metrics


def _cap_message(step: int, num_batches: int, num_kept: int, num_prompts: int, sampling: DynamicSampling) -> str:
    return (
        f"dynamic sampling: step {step_number(step)} drew {num_batches} generation batches "
        f"({num_batches * num_prompts * sampling.batch_multiplier} prompt groups) and kept {num_kept} groups with "
        f"differing rewards of the {num_prompts} it needs "
        f"(ppo.dynamic_sampling_max_gen_batches={sampling.max_gen_batches}). "
        "Raise ppo.dynamic_sampling_max_gen_batches or ppo.batch_multiplier, lower ppo.num_prompts_per_step, "
        "raise ppo.num_generations_per_prompt, or check the reward: almost every group gets the same reward for "
        "all its rollouts (all solved or all failed)"
    )
