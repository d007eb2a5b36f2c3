"""Fakes for driving the real `ppo_step` on CPU: hand-made trajectories, step settings built from a small config
tree, and a policy and a critic that answer with fixed tensors and log every call (in order, with a snapshot of
the batch they were handed). A module with its own name (not conftest) so the tests import it unambiguously.

Shapes: B rows, S positions (right padding, pad id 0).
"""

import copy
import itertools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import Any

import torch

from asyncppo.config import validate_tree
from asyncppo.trainer.builders import step_settings
from asyncppo.trainer.ppo_step import StepSettings
from asyncppo.types import MessageSpan, Role, TrainBatch, Trajectory, collate_trajectories
from asyncppo.workers.groups import PolicyModel, ValueModel
from asyncppo.workers.value_worker import Offsets
from ppo_settings import gae_section, turn_gae_section

PAD = 0
GENERATION_LOGPROB = -0.5

# gamma = lambda = 1 makes every token-level return equal the terminal reward: G_t = R.
GAE = gae_section()
TURN_GAE = turn_gae_section(turn_gae_lambda_value=0.5)
_TREE: dict[str, Any] = {
    "model": {"model_name": "tiny:tiny", "train_micro_batch_size": 2},
    "value": {"train_micro_batch_size": 2},
    "data": {"train_path": "unused.jsonl"},
    "ppo": {"num_prompts_per_step": 2, "num_generations_per_prompt": 2, "max_num_steps": 4, "ppo_epochs": 1},
}


def settings_from_config(
    estimator: Mapping[str, Any],
    ppo: Mapping[str, Any] | None = None,
    value_loss_fn: Mapping[str, Any] | None = None,
    loss_fn: Mapping[str, Any] | None = None,
) -> StepSettings:
    """StepSettings the way the driver builds them: a config tree, validated, through `builders.step_settings`."""
    tree = copy.deepcopy(_TREE)
    tree["ppo"] |= {"adv_estimator": dict(estimator), **(ppo or {})}
    if value_loss_fn is not None:
        tree["value_loss_fn"] = dict(value_loss_fn)
    if loss_fn:
        tree["loss_fn"] = dict(loss_fn)
    return step_settings(validate_tree(tree))


def trajectory_of_ids(
    messages: Sequence[tuple[Role, Sequence[int]]], reward: float, group_id: int, sample_index: int = 0, **fields: Any
) -> Trajectory:
    """A rollout of policy version 0 whose messages are `messages` (role, token ids); the messages before the first
    assistant one are the prompt.

    The assistant tokens are the generated ones (loss mask 1, generation logprob -0.5); `fields` sets the others
    (`mask_sample`, `task`, ...).
    """
    loss_mask = [int(role == "assistant") for role, ids in messages for _ in ids]
    return Trajectory(
        token_ids=[token for _, ids in messages for token in ids],
        loss_mask=loss_mask,
        generation_logprobs=[GENERATION_LOGPROB * generated for generated in loss_mask],
        prompt_length=loss_mask.index(1),
        message_log=[MessageSpan(role, len(ids)) for role, ids in messages],
        reward=reward,
        group_id=group_id,
        sample_index=sample_index,
        policy_version=0,
        last_policy_version=0,
        **fields,
    )


def trajectory(
    messages: Sequence[tuple[Role, int]], reward: float, group_id: int, sample_index: int = 0, mask_sample: bool = False
) -> Trajectory:
    """A rollout whose message log is `messages` (role, num_tokens); the first message is the prompt.

    Token t has id 10 + t; the assistant tokens are the generated ones (loss mask 1, generation logprob -0.5).
    """
    ids = itertools.count(10)
    with_ids = [(role, [next(ids) for _ in range(num_tokens)]) for role, num_tokens in messages]
    return trajectory_of_ids(with_ids, reward, group_id, sample_index, mask_sample=mask_sample)


def single_turn(
    prompt: int, response: int, reward: float, group_id: int, sample_index: int = 0, mask_sample: bool = False
) -> Trajectory:
    return trajectory([("user", prompt), ("assistant", response)], reward, group_id, sample_index, mask_sample)


def collate(trajectories: Sequence[Trajectory]) -> TrainBatch:
    return collate_trajectories(trajectories, PAD)


def snapshot(batch: TrainBatch) -> TrainBatch:
    """A copy with every tensor cloned, so what a call saw cannot change after it returns."""
    clones = {
        spec.name: value.clone()
        for spec in fields(batch)
        if isinstance(value := getattr(batch, spec.name), torch.Tensor)
    }
    return batch.with_fields(**clones)


@dataclass(frozen=True)
class Call:
    """One model call made by the step: `model.method`, the batch it received, and the critic's offsets."""

    name: str
    batch: TrainBatch
    offsets: Offsets | None = None


@dataclass
class CallLog:
    """Every call of both fakes, in the order the step made them."""

    calls: list[Call] = field(default_factory=list[Call])

    @property
    def labels(self) -> list[str]:
        return [call.name for call in self.calls]

    def of(self, name: str) -> list[Call]:
        return [call for call in self.calls if call.name == name]


def pass_metrics(index: int) -> dict[str, float]:
    """What FakeValue reports for its index-th (0-based) training pass: loss 1/(i+1), loss-derived EV 0.1 (i+1)."""
    return {"critic/loss": 1.0 / (index + 1), "critic/explained_var": 0.1 * (index + 1)}


POST_UPDATE_METRICS = {"critic/loss": 0.05, "critic/explained_var": 0.97}
"""What FakeValue reports for the forward-only re-score (`evaluate`)."""


class FakePolicy(PolicyModel):
    """Old and reference logprobs = the generation logprobs (no mismatch); train reports its pass index as loss."""

    def __init__(self, log: CallLog) -> None:
        self.log = log

    def logprobs(self, batch: TrainBatch) -> torch.Tensor:
        self.log.calls.append(Call("policy.logprobs", snapshot(batch)))
        return batch.generation_logprobs.clone()

    def reference_logprobs(self, batch: TrainBatch) -> torch.Tensor:
        self.log.calls.append(Call("policy.reference_logprobs", snapshot(batch)))
        return batch.generation_logprobs.clone()

    def train(self, batch: TrainBatch) -> dict[str, float]:
        passes = len(self.log.of("policy.train"))
        self.log.calls.append(Call("policy.train", snapshot(batch)))
        return {"policy/loss": float(passes)}

    def train_on_policy(self, batch: TrainBatch) -> tuple[dict[str, float], torch.Tensor]:
        """A pass that scores its own old logprobs: the generation logprobs, as `logprobs` answers."""
        assert batch.old_logprobs is None, "the step hands a fused pass no old logprobs"
        passes = len(self.log.of("policy.train"))
        self.log.calls.append(Call("policy.train", snapshot(batch)))
        return {"policy/loss": float(passes)}, batch.generation_logprobs.clone()


class FakeValue(ValueModel):
    """A critic whose values are the fixed `[B, S]` tensor it was built with, or a function of the batch it scores
    (for a critic whose layout differs from the policy's); train reports `pass_metrics`."""

    def __init__(self, log: CallLog, values: torch.Tensor | Callable[[TrainBatch], torch.Tensor]) -> None:
        self.log = log
        self._values = values

    def values(self, batch: TrainBatch) -> torch.Tensor:
        self.log.calls.append(Call("value.values", snapshot(batch)))
        if callable(self._values):
            return self._values(batch).float()
        assert self._values.shape == batch.input_ids.shape, "the fake's values must match the batch"
        return self._values.float().clone()

    def train(self, batch: TrainBatch, offsets: Offsets | None = None) -> dict[str, float]:
        passes = len(self.log.of("value.train"))
        self._record("value.train", batch, offsets)
        return pass_metrics(passes)

    def evaluate(self, batch: TrainBatch, offsets: Offsets | None = None) -> dict[str, float]:
        self._record("value.evaluate", batch, offsets)
        return dict(POST_UPDATE_METRICS)

    def _record(self, name: str, batch: TrainBatch, offsets: Offsets | None) -> None:
        copied = None if offsets is None else (offsets[0].clone(), offsets[1].clone())
        self.log.calls.append(Call(name, snapshot(batch), copied))
