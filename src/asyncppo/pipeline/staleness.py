"""Staleness arithmetic of async PPO: which steps a generation version may fill, and how old a batch may be.

Pure functions (hand-tested in tests/pipeline/test_staleness.py); the Collector asks which targets to fill,
the TrajectoryBuffer evicts with `sample_max_age`, the batch source reports ages.

    generation version g --target_window / collectable_targets--> target steps t the collector may reserve
    training step s      --sample_max_age-------------------------> evict groups with g < s - age
    (s, g)               --policy_age------------------------------> how many policy updates the data lags

Versions are weight versions: the weights in use during step s are version s (the weights after step s are
s + 1). W = policy_training_start_step: steps 0..W-1 train only the critic and step W is the first policy
update, so every version g <= W is the same policy pi_0, and version g > W is pi_{g-W}.
"""

from collections.abc import Callable
from dataclasses import dataclass


def target_window(generation_version: int, initial_version: int, age: int) -> range:
    """Steps that groups generated with `generation_version` may train at: [g+1, g+age], or [g, g+age] at start.

    Only the initial version (the weights a run starts or resumes with) may fill its own step: any later
    version is published after step g - 1 ends, when step g's batch must already be in flight.
    """
    first = generation_version if generation_version == initial_version else generation_version + 1
    return range(first, generation_version + age + 1)


def collector_lead_age(step: int, policy_training_start_step: int, train_age: int, warmup_age: int) -> int:
    """How far ahead the collector generates at version `step`: warmup_age while the policy is frozen (s <= W)."""
    return warmup_age if step <= policy_training_start_step else train_age


def sample_max_age(step: int, policy_training_start_step: int, train_age: int, warmup_age: int) -> int:
    """The oldest generation version step s may train on is s - age, with age = warmup_age through s = W + train_age.

    The second boundary (W + train_age, not W): a group banked with frozen weights (g <= W) for a target up
    to W + train_age is still within train_age policy updates of the actor, and the collector has moved past
    its target, so evicting it at W would leave that target without a producer (a deadlock).
    """
    return warmup_age if step <= policy_training_start_step + train_age else train_age


def policy_age(consumed_step: int, generation_version: int, policy_training_start_step: int) -> int:
    """Policy updates between the policy that generated and the one that trains: max(0, s-W) - max(0, g-W).

    Freeze-aware: during the critic warm-up every version is pi_0, so data generated then has age 0 until the
    policy starts moving.
    """
    start = policy_training_start_step
    return max(0, consumed_step - start) - max(0, generation_version - start)


def survives_until(
    generation_version: int, target: int, max_age_of_step: Callable[[int], int], first_step: int = 0
) -> bool:
    """True when no take() of a step in [first_step, target] (after g) evicts a group generated with version g.

    Eviction at step s drops g < s - max_age_of_step(s); checking every step up to the target (not only the
    target) keeps this exact even when warmup_age < train_age makes s - age non-monotone.
    """
    return all(
        generation_version >= step - max_age_of_step(step)
        for step in range(max(generation_version + 1, first_step), target + 1)
    )


@dataclass(frozen=True)
class AgeSchedule:
    """The staleness settings of a run, bound once so the collector and the batch source cannot disagree.

    Built from `ppo.policy_training_start_step`, `async_ppo.max_trajectory_age_steps` (train_age) and
    `async_ppo.warmup_max_trajectory_age_steps` (warmup_age; pass train_age when that key is null).
    """

    policy_training_start_step: int
    train_age: int
    warmup_age: int

    def __post_init__(self) -> None:
        if self.policy_training_start_step < 0:
            raise ValueError(f"policy_training_start_step must be >= 0, got {self.policy_training_start_step}")
        if self.train_age < 1:
            raise ValueError(f"max_trajectory_age_steps must be >= 1, got {self.train_age}")
        if self.warmup_age < 1:
            raise ValueError(f"warmup_max_trajectory_age_steps must be >= 1, got {self.warmup_age}")

    @property
    def max_age(self) -> int:
        """The larger of the two ages: how many steps ahead the collector can ever reach."""
        return max(self.train_age, self.warmup_age)

    def lead_age(self, generation_version: int) -> int:
        """collector_lead_age at this version."""
        return collector_lead_age(generation_version, self.policy_training_start_step, self.train_age, self.warmup_age)

    def sample_max_age(self, step: int) -> int:
        """sample_max_age at this step."""
        return sample_max_age(step, self.policy_training_start_step, self.train_age, self.warmup_age)

    def policy_age(self, consumed_step: int, generation_version: int) -> int:
        """policy_age with this run's W."""
        return policy_age(consumed_step, generation_version, self.policy_training_start_step)

    def collectable_targets(self, generation_version: int, initial_version: int) -> list[int]:
        """Targets the collector may reserve at this version: the lead window, minus targets its groups would
        not survive to (NeMo-RL's collector generates such groups and evicts them later; we never generate them)."""
        window = target_window(generation_version, initial_version, self.lead_age(generation_version))
        return [target for target in window if survives_until(generation_version, target, self.sample_max_age)]
