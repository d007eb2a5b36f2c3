"""The privileged critic in a real run: the tiny model trains on arithmetic rows whose `answer` task field only
the critic reads, and every step reports privilege/* metrics."""

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from asyncppo.config import validate_tree
from asyncppo.metrics import read_metrics_jsonl
from asyncppo.trainer.build import build_run
from asyncppo.trainer.loop import train

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def test_run_with_a_privileged_critic_trains_and_reports_privilege_metrics(
    ray_cluster: None, data_dir: Path, tmp_path: Path, tiny_run_tree: Callable[..., dict[str, Any]]
):
    tree = tiny_run_tree(data_dir, val_at_end=False)
    tree["value"]["privileged_critic"] = {"enabled": True, "fields": [{"name": "answer"}], "max_total_tokens": 32}
    tree["checkpointing"] = {"enabled": False}
    run = build_run(validate_tree(tree), tmp_path)
    try:
        assert run.critic_view is not None
        train(run)
    finally:
        run.close()

    metrics = read_metrics_jsonl(tmp_path / "metrics.jsonl")
    assert [m["step"] for m in metrics] == [1, 2]
    for step in metrics:
        assert step["train/policy_trained"] == 1.0
        assert step["privilege/n_rows_without_privilege"] == 0.0
        assert step["privilege/frac_truncated"] == 0.0 and step["privilege/frac_truncated_answer"] == 0.0
        assert step["privilege/dropped_tokens_mean"] == 0.0
        # A system message around `<reference>\n<answer>\n25\n</answer>\n</reference>`: dozens of tiny-BPE tokens.
        assert 20 < step["privilege/block_tokens_mean"] <= step["privilege/block_tokens_max"] < 32 + 128
        assert step["critic/num_optimizer_steps"] >= 1 and step["critic/loss"] >= 0.0
    # The critic learned from step 1: its pre-update values at step 2 are no longer the fresh head's zeros.
    assert metrics[0]["critic/mean_v_early"] == 0.0 and metrics[1]["critic/mean_v_early"] != 0.0
