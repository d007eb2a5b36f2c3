"""Offline critic pretraining end to end on the CPU demo (demo:arithmetic): `collect` writes shards and resumes
after the last complete one, `pretrain` reports the held-out terminal AUC and explained variance, and its
checkpoint warm-starts the PPO critic through `value.warm_start_path`'s loader, explaining more variance on the
held-out rollouts than a cold start.

A 1-step PPO run per variant costs Ray and three workers each, so the step-1 `critic/explained_var` of a warm
and a cold PPO run is measured by hand with the CLI (README, "Offline critic pretraining"); here the same
comparison runs in-process on the held-out batch.
"""

import json
import math
from pathlib import Path

import pytest

from asyncppo.config import load_config
from asyncppo.trainer.critic_collection import collect_shards
from asyncppo.trainer.critic_pretraining import (
    CRITIC_PRETRAIN_DIR,
    METRICS_FILE,
    PREFIX,
    evaluate,
    pretrain_critic,
    pretraining_value_worker,
    split_rollouts,
    target_batch,
)
from asyncppo.trainer.setup import resolve_setup

pytestmark = [pytest.mark.integration, pytest.mark.slow]
REPO = Path(__file__).parents[2]
# 2 x 256 prompts of the 336 (held out: a fifth of the prompts), 500 steps at 1e-4: the held-out loss and explained
# variance improve on the cold critic's. The held-out terminal AUC is not asserted above chance: it measured ~0.58
# at 500 steps on one fresh install and 0.47-0.48 on a later one (same code, same seeds; README, "Offline critic
# pretraining"), so it is checked for being a probability and for the cold critic's ties (0.5).
OVERRIDES = [
    "critic_pretrain.prompts_per_shard=256",
    "critic_pretrain.steps=500",
    "critic_pretrain.eval_period=250",
    "critic_pretrain.lr=1.0e-4",
]


def test_collect_pretrain_and_warm_start_the_demo_critic(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.chdir(REPO)  # the demo config's data paths are relative to the repository
    config = load_config(REPO / "examples" / "configs" / "demo.yaml", OVERRIDES)
    run_dir = tmp_path / "run"

    setup = resolve_setup(config, data=True)
    first = collect_shards(setup, run_dir, num_shards=1)
    shard_zero = first[0].read_bytes()
    shards = collect_shards(setup, run_dir, num_shards=2)  # resumes: shard 0 is kept, shard 1 is added
    assert [path.name for path in shards] == ["shard_00000.jsonl", "shard_00001.jsonl"]
    assert shards[0].read_bytes() == shard_zero

    checkpoint, last = pretrain_critic(setup, run_dir)
    records = [json.loads(line) for line in (run_dir / CRITIC_PRETRAIN_DIR / METRICS_FILE).read_text().splitlines()]
    evaluations = [record for record in records if f"{PREFIX}held_out_terminal_auc" in record]
    assert [record["step"] for record in evaluations] == [0, 250, 500]
    aucs = [record[f"{PREFIX}held_out_terminal_auc"] for record in evaluations]
    assert aucs[0] == 0.5 and all(math.isfinite(auc) and 0.0 <= auc <= 1.0 for auc in aucs), evaluations
    assert last[f"{PREFIX}held_out_terminal_auc"] == aucs[-1]
    losses = [record[f"{PREFIX}held_out_loss"] for record in evaluations]
    assert losses[-1] < losses[0], evaluations
    cold_ev = evaluations[0][f"{PREFIX}held_out_explained_var"]
    warm_ev = last[f"{PREFIX}held_out_explained_var"]
    assert warm_ev > cold_ev, evaluations

    # The PPO run's loader (ValueWorker.warm_start) takes the checkpoint as it is: same weights, same numbers.
    rollouts, _, held_out = split_rollouts(config, run_dir)
    worker = pretraining_value_worker(setup)
    batch, to_abs, to_res = target_batch(config, rollouts, held_out, setup.pad_token_id)
    cold = evaluate(config, worker, batch, (to_abs, to_res))
    worker.warm_start(checkpoint)
    warm = evaluate(config, worker, batch, (to_abs, to_res))
    key = f"{PREFIX}held_out_explained_var"
    assert cold[key] == pytest.approx(cold_ev, abs=1e-6)
    assert warm[key] == pytest.approx(warm_ev, abs=1e-5)
    assert (checkpoint / "warm_start_provenance.txt").is_file()
