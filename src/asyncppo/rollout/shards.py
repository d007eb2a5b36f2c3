"""Rollout shards on disk: the trajectories offline critic pretraining trains on, one JSON line per trajectory.

Written by `trainer/critic_collection.py` (`asyncppo critic collect`), read by `trainer/critic_pretraining.py`.

    <dir>/shard_00000.jsonl, shard_00001.jsonl, ...   each written to a `.tmp` file and renamed when complete,
                                                      so a shard that exists is whole; leftovers are ignored

A line is a Trajectory's fields (token ids, loss mask, generation logprobs, reward, group id, message spans,
policy version, task fields, ...), so a shard reads back into the same records the trainer collates.
"""

import dataclasses
import json
import os
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from asyncppo.types import MessageSpan, Trajectory

SHARD_NAME = "shard_{index:05d}.jsonl"
_SHARD_FILE = re.compile(r"shard_(\d{5})\.jsonl")


def shard_path(directory: str | os.PathLike[str], index: int) -> Path:
    return Path(directory) / SHARD_NAME.format(index=index)


def write_shard(directory: str | os.PathLike[str], index: int, trajectories: Sequence[Trajectory]) -> Path:
    """Write shard `index` atomically (a temporary file, flushed and fsynced, then renamed); returns its path."""
    if not trajectories:
        raise ValueError(f"shard {index}: no trajectories to write")
    path = shard_path(directory, index)
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(path.name + ".tmp")
    with temporary.open("w", encoding="utf-8") as file:
        for trajectory in trajectories:
            # allow_nan=False: a NaN reward or logprob is refused here, not discovered by the pretraining.
            file.write(json.dumps(dataclasses.asdict(trajectory), allow_nan=False) + "\n")
        file.flush()
        os.fsync(file.fileno())
    os.replace(temporary, path)
    return path


def complete_shard_indices(directory: str | os.PathLike[str]) -> list[int]:
    """Indices of the complete shards in `directory`, ascending (temporary leftovers are not shards)."""
    directory = Path(directory)
    if not directory.is_dir():
        return []
    found = (_SHARD_FILE.fullmatch(path.name) for path in directory.iterdir())
    return sorted(int(match.group(1)) for match in found if match is not None)


def _trajectory(record: dict[str, Any], where: str) -> Trajectory:
    try:
        spans = [MessageSpan(**span) for span in record.pop("message_log")]
        return Trajectory(**record, message_log=spans)
    except (KeyError, TypeError, ValueError) as error:
        raise ValueError(f"{where}: not a trajectory record ({error})") from None


def read_shard(path: str | os.PathLike[str]) -> list[Trajectory]:
    """The trajectories of one shard file; ValueError naming the file and line for a malformed record."""
    trajectories = []
    with Path(path).open(encoding="utf-8") as file:
        for line_number, line in enumerate(file, start=1):
            where = f"{path}:{line_number}"
            try:
                record = json.loads(line)
            except json.JSONDecodeError as error:
                raise ValueError(f"{where}: not JSON ({error})") from None
            trajectories.append(_trajectory(record, where))
    return trajectories


def read_shards(directory: str | os.PathLike[str]) -> list[Trajectory]:
    """Every complete shard's trajectories, in shard order; ValueError when there is none."""
    indices = complete_shard_indices(directory)
    if not indices:
        raise ValueError(f"{str(directory)!r} holds no rollout shards (shard_NNNNN.jsonl); run asyncppo critic collect")
    return [trajectory for index in indices for trajectory in read_shard(shard_path(directory, index))]
