"""Rollout shards: a trajectory survives the round trip, a shard appears only whole (a partial `.tmp` file is
never read), and collection resumes after the last complete shard."""

from pathlib import Path

import pytest

from asyncppo.config import ConfigError
from asyncppo.rollout.shards import complete_shard_indices, read_shard, read_shards, shard_path, write_shard
from asyncppo.trainer.critic_collection import completed_shards, source_state_path
from asyncppo.types import MessageSpan, Trajectory


def _trajectory(group_id: int, reward: float) -> Trajectory:
    return Trajectory(
        token_ids=[1, 2, 3, 4],
        loss_mask=[0, 0, 1, 1],
        generation_logprobs=[0.0, 0.0, -0.5, -0.25],
        prompt_length=2,
        message_log=[MessageSpan("user", 2), MessageSpan("assistant", 2)],
        reward=reward,
        group_id=group_id,
        sample_index=0,
        policy_version=0,
        last_policy_version=0,
        task={"answer": "7", "nested": {"k": [1, 2]}},
    )


def test_a_shard_reads_back_the_trajectories_it_was_written_with(tmp_path: Path):
    written = [_trajectory(0, 1.0), _trajectory(1, 0.0)]
    path = write_shard(tmp_path, 3, written)
    assert path == shard_path(tmp_path, 3) and path.name == "shard_00003.jsonl"
    assert read_shard(path) == written
    assert not list(tmp_path.glob("*.tmp"))


def test_a_partial_shard_is_never_read(tmp_path: Path):
    write_shard(tmp_path, 0, [_trajectory(0, 1.0)])
    # A collection killed mid-write leaves only the temporary file, cut short.
    (tmp_path / "shard_00001.jsonl.tmp").write_text('{"token_ids": [1, 2')
    assert complete_shard_indices(tmp_path) == [0]
    assert len(read_shards(tmp_path)) == 1


def test_reading_no_shards_or_a_malformed_one_names_the_problem(tmp_path: Path):
    with pytest.raises(ValueError, match="holds no rollout shards"):
        read_shards(tmp_path)
    shard_path(tmp_path, 0).write_text('{"reward": 1.0}\n')
    with pytest.raises(ValueError, match=r"shard_00000.jsonl:1: not a trajectory record"):
        read_shards(tmp_path)


def test_a_nan_reward_is_refused_when_written(tmp_path: Path):
    with pytest.raises(ValueError):
        write_shard(tmp_path, 0, [_trajectory(0, float("nan"))])
    assert complete_shard_indices(tmp_path) == []


def test_collection_resumes_after_the_last_complete_shard_and_refuses_gaps(tmp_path: Path):
    assert completed_shards(tmp_path) == []
    for index in (0, 1):
        source_state_path(tmp_path, index).write_bytes(b"state")
        write_shard(tmp_path, index, [_trajectory(index, 1.0)])
    assert completed_shards(tmp_path) == [0, 1]
    write_shard(tmp_path, 3, [_trajectory(3, 1.0)])
    with pytest.raises(ConfigError, match=r"not numbered 0\.\.2"):
        completed_shards(tmp_path)
    shard_path(tmp_path, 3).unlink()
    source_state_path(tmp_path, 1).unlink()
    with pytest.raises(ConfigError, match=r"shard 1 has no source_00001\.pt"):
        completed_shards(tmp_path)
