"""Per-step rollout dumps: one step's TrainBatch, with values and advantages, as a `.pt` file for offline analysis.

The driver calls `write_rollout_dump` on dump steps once advantages are known. The file holds only tensors,
lists, numbers and strings, so `torch.load(path, weights_only=True)` reads it. Shapes: B samples, S positions,
N policy tokens of the whole batch (the packed per-token arrays list them sample by sample, position by position).
"""

import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Literal

import torch

from asyncppo.types import TrainBatch

FORMAT_VERSION = 1
DESCRIPTION = """asyncppo rollout dump, format_version 1. Per-sample arrays [B]: sample_index, reward (after reward
processing), sample_loss_mask, input_length, prompt_length, num_response_tokens (policy tokens), prompt_group_index
and generation_index (from group_id, in order of appearance), group_id, policy_version, truncated; content (each
sample's decoded text, prompt included) when the writer had a tokenizer. Packed per-policy-token arrays [N] (tokens
with token_mask 1, sample by sample): token_sample_index, token_sequence_position, token_response_position
(= position - prompt_length), token_ids, token_text (each token decoded alone; with content), generation_logprobs,
old_logprobs (the pre-update trainer logprobs; 'prev_logprobs' in NeMo-RL), advantages (after whitening),
values (when the run has a critic), returns, reference_policy_logprobs and is_anchor (turn credit: returns are
critic targets only where is_anchor is true; filter before averaging). Optional keys are absent, never None.
Scalars: step, num_generations_per_prompt, credit_level, adv_raw_mean, adv_raw_std (before whitening)."""


def _group_positions(group_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(prompt_group_index, generation_index) [B]: group ordinal by first appearance, and rank within the group.

    Equal to (i // G, i % G) for the usual layout of G consecutive siblings, and still truthful when it is not.
    """
    group_index: dict[int, int] = {}
    group_sizes: list[int] = []
    prompt_group_index, generation_index = [], []
    for group_id in group_ids.tolist():
        ordinal = group_index.setdefault(group_id, len(group_index))
        if ordinal == len(group_sizes):
            group_sizes.append(0)
        prompt_group_index.append(ordinal)
        generation_index.append(group_sizes[ordinal])
        group_sizes[ordinal] += 1
    return torch.tensor(prompt_group_index, dtype=torch.long), torch.tensor(generation_index, dtype=torch.long)


def build_rollout_dump(
    step: int,
    batch: TrainBatch,
    *,
    num_generations_per_prompt: int,
    credit_level: Literal["token", "turn"],
    adv_raw_mean: float,
    adv_raw_std: float,
    decode: Callable[[Sequence[int]], str] | None = None,
    anchor_mask: torch.Tensor | None = None,
) -> dict[str, Any]:
    """The dump payload (see DESCRIPTION); `write_rollout_dump` saves it. anchor_mask [B, S] in turn mode only.

    `decode` (token ids -> text, the run's tokenizer) fills `content` and `token_text`; without it both are absent.
    """
    _check_arguments(len(batch), batch.seq_len, num_generations_per_prompt, credit_level, anchor_mask)
    batch = batch.to("cpu")
    advantages, old_logprobs = batch.advantages, batch.old_logprobs
    if advantages is None or old_logprobs is None:
        raise ValueError(f"rollout dump at step {step} needs batch.advantages and batch.old_logprobs; dump after both")
    policy_token = batch.token_mask > 0
    rows, positions = policy_token.nonzero(as_tuple=True)

    def packed(values: torch.Tensor) -> torch.Tensor:
        return values.detach()[rows, positions].float()

    dump: dict[str, Any] = {
        "format_version": FORMAT_VERSION,
        "description": DESCRIPTION,
        "step": step,
        "num_generations_per_prompt": num_generations_per_prompt,
        "credit_level": credit_level,
        "adv_raw_mean": float(adv_raw_mean),
        "adv_raw_std": float(adv_raw_std),
        **_per_sample_arrays(batch, policy_token),
        "token_sample_index": rows,
        "token_sequence_position": positions,
        "token_response_position": positions - batch.prompt_lengths[rows],
        "token_ids": batch.input_ids[rows, positions].long(),
        "generation_logprobs": packed(batch.generation_logprobs),
        "old_logprobs": packed(old_logprobs),
        "advantages": packed(advantages),
    }
    if decode is not None:
        lengths = dump["input_length"].tolist()
        dump["content"] = [decode(batch.input_ids[row, : lengths[row]].tolist()) for row in range(len(batch))]
        dump["token_text"] = [decode([token_id]) for token_id in dump["token_ids"].tolist()]
    optional = {
        "values": batch.values,
        "returns": batch.returns,
        "reference_policy_logprobs": batch.reference_logprobs,
    }
    for key, values in optional.items():
        if values is not None:
            dump[key] = packed(values)
    if anchor_mask is not None:
        dump["is_anchor"] = anchor_mask.detach().cpu()[rows, positions].bool()
    return dump


def _check_arguments(
    size: int,
    seq_len: int,
    num_generations_per_prompt: int,
    credit_level: str,
    anchor_mask: torch.Tensor | None,
) -> None:
    """ValueError for a credit level, anchor mask or group size `build_rollout_dump` cannot describe."""
    if credit_level not in ("token", "turn"):
        raise ValueError(f"credit_level must be 'token' or 'turn', got {credit_level!r}")
    if (anchor_mask is not None) != (credit_level == "turn"):
        raise ValueError(f"anchor_mask must be given exactly in turn credit mode (credit_level={credit_level!r})")
    if anchor_mask is not None and tuple(anchor_mask.shape) != (size, seq_len):
        raise ValueError(f"anchor_mask shape {tuple(anchor_mask.shape)} != batch shape {(size, seq_len)}")
    if num_generations_per_prompt < 1:
        raise ValueError(f"num_generations_per_prompt must be >= 1, got {num_generations_per_prompt}")


def _per_sample_arrays(batch: TrainBatch, policy_token: torch.Tensor) -> dict[str, torch.Tensor]:
    """The dump's per-sample arrays [B] (DESCRIPTION), in its key order; `policy_token` [B, S] bool."""
    prompt_group_index, generation_index = _group_positions(batch.group_ids)
    return {
        "sample_index": torch.arange(len(batch)),
        "reward": batch.rewards.float(),
        "sample_loss_mask": batch.sample_mask.float(),
        "input_length": batch.attention_mask.sum(dim=1).long(),
        "prompt_length": batch.prompt_lengths.long(),
        "num_response_tokens": policy_token.sum(dim=1).long(),
        "prompt_group_index": prompt_group_index,
        "generation_index": generation_index,
        "group_id": batch.group_ids.long(),
        "policy_version": batch.policy_versions.long(),
        "truncated": batch.truncated.bool(),
    }


def write_rollout_dump(
    path: str | os.PathLike[str],
    step: int,
    batch: TrainBatch,
    *,
    num_generations_per_prompt: int,
    credit_level: Literal["token", "turn"],
    adv_raw_mean: float,
    adv_raw_std: float,
    decode: Callable[[Sequence[int]], str] | None = None,
    anchor_mask: torch.Tensor | None = None,
) -> Path:
    """Save `build_rollout_dump(...)` to `path` (written to a temp name, then renamed); returns the path."""
    dump = build_rollout_dump(
        step,
        batch,
        num_generations_per_prompt=num_generations_per_prompt,
        credit_level=credit_level,
        adv_raw_mean=adv_raw_mean,
        adv_raw_std=adv_raw_std,
        decode=decode,
        anchor_mask=anchor_mask,
    )
    output = Path(path)
    output.parent.mkdir(parents=True, exist_ok=True)
    temporary = output.with_name(f".{output.name}.tmp")
    torch.save(dump, temporary)
    os.replace(temporary, output)
    return output
