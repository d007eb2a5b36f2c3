"""The `critic_pretrain` section: offline critic pretraining (`asyncppo critic collect` and `critic pretrain`).

Read by `trainer/critic_collection.py` and `trainer/critic_pretraining.py`; PPO itself never reads it.
"""

from pydantic import Field, PositiveInt

from asyncppo.config.base import Section


class CriticPretrainConfig(Section):
    """Collecting rollout shards with the config's policy, and training the value model alone on them."""

    num_shards: PositiveInt = 2
    """Shards `asyncppo critic collect` stops after (counting shards written by earlier attempts)."""
    prompts_per_shard: PositiveInt = 32
    """Prompt groups per shard, each of ppo.num_generations_per_prompt rollouts."""
    steps: PositiveInt = 300
    """Optimizer steps of `asyncppo critic pretrain` (the value scheduler spans them)."""
    lr: float | None = Field(default=None, gt=0)
    """Peak learning rate of the pretraining; null = value.optimizer.lr. Offline, on a fixed set of rollouts,
    a lower rate than PPO's often generalizes better (the CPU demo: 1e-4 where PPO takes 1e-3)."""
    batch_size: PositiveInt = 64
    """Rollouts per optimizer step, drawn at random from the training split."""
    held_out_fraction: float = Field(default=0.2, ge=0, lt=1)
    """Fraction of the prompts kept out of training and evaluated on, each with all its rollouts (never single
    rollouts; a prompt drawn again in a later epoch stays on its side)."""
    eval_period: PositiveInt = 50
    """Optimizer steps between evaluations on the held-out split (and one after the last step)."""
    success_reward_threshold: float = 0.0
    """A rollout counts as a success for the terminal AUC when its reward is above this."""
