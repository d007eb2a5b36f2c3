"""Per-step training records: `train_data/train_data_step{N}.jsonl` in the run directory, one JSON line per trained
sample (its texts, token counts, reward, mean advantage, group and policy version).

The driver writes it after step N (1-based, as metrics.jsonl counts) every `logger.train_data_period` steps when
the run does not log raw gym responses (`env.should_log_nemo_gym_responses`), so every run keeps a readable record
of what it trained on. The driver decodes the texts with the run's tokenizer; this module only arranges and writes.
"""

import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from asyncppo.types import TrainBatch

TRAIN_DATA_DIR = "train_data"


def train_data_path(run_dir: str | os.PathLike[str], step: int) -> Path:
    """Where step `step`'s records go (NeMo-RL's file name, in a directory of their own)."""
    return Path(run_dir) / TRAIN_DATA_DIR / f"train_data_step{step}.jsonl"


def train_data_records(
    step: int,
    batch: TrainBatch,
    *,
    prompts: Sequence[str],
    responses: Sequence[str],
    reward_components: Sequence[Mapping[str, float]],
) -> list[dict[str, Any]]:
    """One record per batch row, in row order.

    `batch` is the trained batch (rewards after reward processing, advantages after whitening); `prompts` and
    `responses` [B] are the decoded prompt tokens and everything after them (tool turns included), and
    `reward_components` [B] the named parts of each raw reward ({} when the reward has none). Fields:
    step, sample_index, group_id, policy_version, trajectory_age (= step - 1 - policy_version: steps between the
    weights that sampled it and those it trains; 0 in sync runs), prompt, response, num_prompt_tokens,
    num_response_tokens, num_generated_tokens (policy tokens), reward, reward_components, advantage_mean (over the
    policy tokens; null when there are none), sample_mask (0: no policy gradient), truncated.
    """
    size = len(batch)
    for name, values in (("prompts", prompts), ("responses", responses), ("reward_components", reward_components)):
        if len(values) != size:
            raise ValueError(f"train data of step {step}: {name} has {len(values)} entries for {size} samples")
    batch = batch.to("cpu")
    advantages = batch.advantages
    if advantages is None:
        raise ValueError(f"train data of step {step} needs batch.advantages; write it after the advantages")
    token_mask = batch.token_mask
    num_generated = token_mask.sum(dim=1)
    advantage_sums = (advantages.detach().float() * token_mask).sum(dim=1)
    lengths = batch.attention_mask.sum(dim=1)
    records: list[dict[str, Any]] = []
    for row in range(size):
        generated = int(num_generated[row].item())
        prompt_length = int(batch.prompt_lengths[row].item())
        policy_version = int(batch.policy_versions[row].item())
        records.append(
            {
                "step": step,
                "sample_index": row,
                "group_id": int(batch.group_ids[row].item()),
                "policy_version": policy_version,
                "trajectory_age": step - 1 - policy_version,
                "prompt": prompts[row],
                "response": responses[row],
                "num_prompt_tokens": prompt_length,
                "num_response_tokens": int(lengths[row].item()) - prompt_length,
                "num_generated_tokens": generated,
                "reward": float(batch.rewards[row].item()),
                "reward_components": dict(reward_components[row]),
                "advantage_mean": float(advantage_sums[row].item()) / generated if generated else None,
                "sample_mask": float(batch.sample_mask[row].item()),
                "truncated": bool(batch.truncated[row].item()),
            }
        )
    return records


def write_train_data(path: str | os.PathLike[str], records: Sequence[Mapping[str, Any]]) -> Path:
    """Write `records` as JSON lines to `path` (a temp name, then renamed: a reader never sees half a file)."""
    output = Path(path)
    output.parent.mkdir(parents=True, exist_ok=True)
    temporary = output.with_name(f".{output.name}.tmp")
    with temporary.open("w", encoding="utf-8") as handle:
        for record in records:
            handle.write(json.dumps(record, ensure_ascii=False) + "\n")
    os.replace(temporary, output)
    return output
