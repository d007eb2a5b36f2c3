"""`asyncppo critic collect|pretrain`: registered in the CLI; user mistakes end with one line and status 2."""

from pathlib import Path

import pytest

from asyncppo.cli.main import main

DEMO = str(Path(__file__).parents[2] / "examples" / "configs" / "demo.yaml")


def test_pretrain_without_shards_says_to_collect_first(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    assert main(["critic", "pretrain", DEMO, "--run-dir", str(tmp_path)]) == 2
    error = capsys.readouterr().err
    assert "holds no rollout shards" in error and "asyncppo critic collect" in error


def test_collect_refuses_a_shard_count_below_one(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    assert main(["critic", "collect", DEMO, "--shards", "0", "--run-dir", str(tmp_path)]) == 2
    assert "--shards: 0" in capsys.readouterr().err


def test_collect_takes_dotted_overrides(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    assert main(["critic", "collect", DEMO, "critic_pretrain.prompts_per_shard=0", "--run-dir", str(tmp_path)]) == 2
    assert "critic_pretrain.prompts_per_shard" in capsys.readouterr().err
