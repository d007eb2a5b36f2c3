"""The Trajectory record: one rollout exactly as the generator produced it, the unit every layer passes around.

Produced by single-turn rollouts (`rollout/single_turn.py`) and gym rollouts (`gym/`); consumed by
`rollout/batch.py`, which pads a list of them into a TrainBatch. Token exactness: `token_ids` are exactly
the ids the generator saw and produced; nothing downstream re-tokenises them.
"""

from dataclasses import dataclass, field
from typing import Any, Literal

Role = Literal["system", "user", "assistant", "tool"]


@dataclass(frozen=True)
class MessageSpan:
    """One message of the flattened conversation: its role and how many of `token_ids` it covers, in order."""

    role: Role
    num_tokens: int


@dataclass
class Trajectory:
    """One rollout of one prompt.

    `token_ids` = prompt + everything after it (assistant turns and, in multi-turn rollouts, tool or
    environment turns). `loss_mask[t] == 1` exactly on the tokens the policy generated; those carry
    `generation_logprobs[t]` (the sampled token's logprob under the sampling distribution; 0.0 elsewhere).
    `message_log` partitions `token_ids` into messages (sum of num_tokens == len(token_ids)); turn-level
    estimators find their turns there.
    """

    token_ids: list[int]
    loss_mask: list[int]
    generation_logprobs: list[float]
    prompt_length: int
    message_log: list[MessageSpan]
    reward: float
    group_id: int
    """Unique per prompt draw; the siblings of one prompt share it (the residual baseline's groups)."""
    sample_index: int
    """Index of this rollout within its group, 0..G-1."""
    policy_version: int
    """Version of the weights that generated the first token."""
    last_policy_version: int
    """Version of the weights that generated the last token (differs only with in-flight weight updates)."""
    truncated: bool = False
    """The generation hit max_new_tokens (or the context limit) before EOS."""
    mask_sample: bool = False
    """Keep for baselines and critic targets but give it no policy gradient (gym `mask_sample`)."""
    reward_components: dict[str, float] = field(default_factory=dict[str, float])
    """Named parts of the reward (they sum to `reward` when present)."""
    task: dict[str, Any] = field(default_factory=dict[str, Any])
    """The dataset row's task fields (ground truth, ids), for reward functions, dumps and privileged critics."""

    def __post_init__(self) -> None:
        length = len(self.token_ids)
        if len(self.loss_mask) != length or len(self.generation_logprobs) != length:
            raise ValueError(
                f"trajectory of group {self.group_id}: token_ids ({length}), loss_mask ({len(self.loss_mask)}) and "
                f"generation_logprobs ({len(self.generation_logprobs)}) must have the same length"
            )
        covered = sum(span.num_tokens for span in self.message_log)
        if covered != length:
            raise ValueError(
                f"trajectory of group {self.group_id}: message_log covers {covered} tokens but there are {length}"
            )
        if not 0 < self.prompt_length <= length:
            raise ValueError(
                f"trajectory of group {self.group_id}: prompt_length {self.prompt_length} not in 1..{length}"
            )

    @property
    def num_generated_tokens(self) -> int:
        """Tokens the policy produced."""
        return sum(self.loss_mask)
