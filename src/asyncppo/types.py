"""The data exchanged between layers: the Trajectory record, the TrainBatch that pads a list of them, and the
SamplingProfile (temperature, top_p) that generators, gym clients and the policy server agree on.

    list[Trajectory] --collate_trajectories--> TrainBatch --(split for micro-batches / workers)--> workers

Trajectories come from single-turn rollouts (`rollout/single_turn.py`) and gym rollouts (`gym/`); the
pipeline buffers them and the trainer collates them. Token exactness: `token_ids` are exactly the ids the
generator saw and produced; nothing downstream re-tokenises them.

TrainBatch layout (B samples, S positions, right padding): position t holds token t; the logprob of token t,
and the value V(state before token t), sit at position t (so position 0 never carries a logprob).
"""

from collections.abc import Sequence
from dataclasses import dataclass, field, fields, replace
from typing import Any, Literal

import torch

Role = Literal["system", "user", "assistant", "tool"]


@dataclass(frozen=True)
class SamplingProfile:
    """A (temperature, top_p) pair: what gym clients stamp into requests and the policy server enforces.
    Temperature 0 means greedy decoding."""

    temperature: float
    top_p: float

    def __str__(self) -> str:
        return f"({self.temperature}, {self.top_p})"


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
    invalid_tool_call: bool = False
    """An assistant message's text holds tool-call markup the agent did not execute (gym
    `env.gym.invalid_tool_call_patterns`)."""

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


@dataclass(frozen=True)
class TrainBatch:
    """Padded tensors of B trajectories; optional fields are filled by the driver as the step proceeds."""

    input_ids: torch.Tensor
    """[B, S] long, right-padded with the pad id."""
    attention_mask: torch.Tensor
    """[B, S] long, 1 on real tokens."""
    token_mask: torch.Tensor
    """[B, S] float, 1 on tokens the policy generated (the loss mask)."""
    generation_logprobs: torch.Tensor
    """[B, S] float32, the generator's logprob of token t at position t, 0 elsewhere."""
    rewards: torch.Tensor
    """[B] float32, after reward processing."""
    sample_mask: torch.Tensor
    """[B] float32 loss multiplier (0 drops a sample's gradient but keeps it for baselines)."""
    group_ids: torch.Tensor
    """[B] long, prompt group of each sample."""
    prompt_lengths: torch.Tensor
    """[B] long."""
    truncated: torch.Tensor
    """[B] bool, generation hit its length limit."""
    policy_versions: torch.Tensor
    """[B] long, weights version that generated the first token."""
    message_logs: tuple[tuple[MessageSpan, ...], ...]
    """Per sample, the message spans in order (turn spans are built from these)."""
    old_logprobs: torch.Tensor | None = None
    """[B, S] float32, the pre-update policy's logprobs (fixed across ppo_epochs)."""
    reference_logprobs: torch.Tensor | None = None
    """[B, S] float32, the frozen reference policy's logprobs (only when a KL term needs them)."""
    values: torch.Tensor | None = None
    """[B, S] float32, rollout-time (pre-update) critic values, right-shifted."""
    advantages: torch.Tensor | None = None
    """[B, S] float32."""
    returns: torch.Tensor | None = None
    """[B, S] float32, critic targets (0 off the critic mask)."""
    critic_mask: torch.Tensor | None = None
    """[B, S] float, where the critic is supervised (token mask, or the anchor mask in turn mode)."""
    critic_sample_mask: torch.Tensor | None = None
    """[B] float32, the critic's copy of sample_mask (homogeneous-group weighting applies only here)."""

    def __len__(self) -> int:
        return int(self.input_ids.shape[0])

    @property
    def seq_len(self) -> int:
        """S."""
        return int(self.input_ids.shape[1])

    def with_fields(self, **updates: object) -> "TrainBatch":
        """A copy with some fields replaced."""
        return replace(self, **updates)  # pyright: ignore[reportArgumentType]  # fields are checked by dataclass

    def select(self, indices: Sequence[int] | torch.Tensor) -> "TrainBatch":
        """The sub-batch of the given rows, every tensor field sliced the same way."""
        index = torch.as_tensor(indices, dtype=torch.long)
        updates: dict[str, object] = {}
        for spec in fields(self):
            value = getattr(self, spec.name)
            if isinstance(value, torch.Tensor):
                updates[spec.name] = value.index_select(0, index.to(value.device))
        updates["message_logs"] = tuple(self.message_logs[i] for i in index.tolist())
        return replace(self, **updates)  # pyright: ignore[reportArgumentType]

    def to(self, device: torch.device | str) -> "TrainBatch":
        """A copy with every tensor on `device`."""
        updates = {
            spec.name: getattr(self, spec.name).to(device)
            for spec in fields(self)
            if isinstance(getattr(self, spec.name), torch.Tensor)
        }
        return replace(self, **updates)  # pyright: ignore[reportArgumentType]


def collate_trajectories(trajectories: Sequence[Trajectory], pad_token_id: int) -> TrainBatch:
    """Right-pad trajectories into a TrainBatch; sample_mask is 0 for `mask_sample` rollouts, else 1."""
    if not trajectories:
        raise ValueError("cannot collate an empty list of trajectories")
    batch_size = len(trajectories)
    seq_len = max(len(t.token_ids) for t in trajectories)
    input_ids = torch.full((batch_size, seq_len), pad_token_id, dtype=torch.long)
    attention_mask = torch.zeros((batch_size, seq_len), dtype=torch.long)
    token_mask = torch.zeros((batch_size, seq_len), dtype=torch.float32)
    generation_logprobs = torch.zeros((batch_size, seq_len), dtype=torch.float32)
    for row, trajectory in enumerate(trajectories):
        length = len(trajectory.token_ids)
        input_ids[row, :length] = torch.tensor(trajectory.token_ids, dtype=torch.long)
        attention_mask[row, :length] = 1
        token_mask[row, :length] = torch.tensor(trajectory.loss_mask, dtype=torch.float32)
        generation_logprobs[row, :length] = torch.tensor(trajectory.generation_logprobs, dtype=torch.float32)
    return TrainBatch(
        input_ids=input_ids,
        attention_mask=attention_mask,
        token_mask=token_mask,
        generation_logprobs=generation_logprobs,
        rewards=torch.tensor([t.reward for t in trajectories], dtype=torch.float32),
        sample_mask=torch.tensor([0.0 if t.mask_sample else 1.0 for t in trajectories], dtype=torch.float32),
        group_ids=torch.tensor([t.group_id for t in trajectories], dtype=torch.long),
        prompt_lengths=torch.tensor([t.prompt_length for t in trajectories], dtype=torch.long),
        truncated=torch.tensor([t.truncated for t in trajectories], dtype=torch.bool),
        policy_versions=torch.tensor([t.policy_version for t in trajectories], dtype=torch.long),
        message_logs=tuple(tuple(t.message_log) for t in trajectories),
    )
