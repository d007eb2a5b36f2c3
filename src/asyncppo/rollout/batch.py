"""TrainBatch: a list of Trajectories padded into tensors, the one batch format of training and scoring.

    list[Trajectory] --collate_trajectories--> TrainBatch --(split for micro-batches / workers)--> workers

Layout (B samples, S positions, right padding): position t holds token t; the logprob of token t, and the
value V(state before token t), sit at position t (so position 0 never carries a logprob).
"""

from collections.abc import Sequence
from dataclasses import dataclass, fields, replace

import torch

from asyncppo.rollout.trajectory import MessageSpan, Trajectory


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
