"""Sync PPO end to end on a local Ray cluster with the tiny model: colocated and non-colocated runs, exact
weight sync, checkpoints, and a stopped-then-resumed run that repeats an uninterrupted one exactly (and takes a
changed LR, recorded in the run directory's config history)."""

import copy
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml
from safetensors.torch import load_file

from asyncppo.checkpoint import load_run_state, load_state
from asyncppo.config import validate_tree
from asyncppo.metrics import read_metrics_jsonl
from asyncppo.models.tokenizer import load_tokenizer
from asyncppo.models.value import load_value_model, save_value_model, value_head
from asyncppo.trainer.build import build_run
from asyncppo.trainer.loop import train
from asyncppo.trainer.setup import resolve_model_path
from listening_sockets import Listener, listeners, process_tree

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.usefixtures("ray_cluster")]
Train = Callable[[dict[str, Any], Path], list[dict[str, Any]]]


def test_non_colocated_run_trains_generators_hold_the_trainers_exact_weights_and_all_listen_on_loopback(
    data_dir: Path, tmp_path: Path, tiny_run_tree: Callable[..., dict[str, Any]], monkeypatch: pytest.MonkeyPatch
):
    tree = tiny_run_tree(data_dir)
    tree["generation"]["colocated"] = {"enabled": False}
    run = build_run(validate_tree(tree), tmp_path)
    weight_sync = run.workers.weight_sync
    assert weight_sync is not None
    sync_ports = [weight_sync.spec.port]  # to find the weight-sync store among the sockets
    seen: list[list[Listener]] = []
    log_metrics = run.metrics.log

    def log_and_look(step: int, metrics: dict[str, float]) -> None:
        # Called by the loop after each step's weight push: every worker and the sync group are up. Ray's
        # daemons and workers, the sync store, every socket of this process and its descendants, from /proc.
        seen.append(listeners(process_tree(os.getpid())))
        log_metrics(step, metrics)

    monkeypatch.setattr(run.metrics, "log", log_and_look)
    try:
        initial = run.workers.policy.weights()
        train(run)
        assert weight_sync.num_pushes == 3  # initial sync + one per step
        trained = run.workers.policy.weights()
        generated_with = run.workers.generator.weights()
        assert run.workers.generator.policy_version() == 2
    finally:
        run.close()
    assert len(seen) == 2
    for step_listeners in seen:
        assert [listener.port for listener in step_listeners if listener.port in sync_ports] == sync_ports
        exposed = [listener for listener in step_listeners if not listener.is_loopback]
        assert exposed == [], f"listening beyond loopback: {exposed}"
    assert trained.keys() == generated_with.keys()
    assert all(torch.equal(trained[name], generated_with[name]) for name in trained)
    assert any(not torch.equal(trained[name], initial[name]) for name in trained), "the policy did not train"
    metrics = read_metrics_jsonl(tmp_path / "metrics.jsonl")
    assert [m["step"] for m in metrics] == [1, 2]
    assert metrics[-1]["val/reward_mean"] >= 0
    for key in ("train/reward_mean", "critic/explained_var", "mismatch/token_mult_prob_error", "policy/loss"):
        assert key in metrics[0], key
    # Generator logprobs and the trainer's recompute agree (same fp32 weights, same temperature).
    assert metrics[0]["mismatch/token_mult_prob_error"] == pytest.approx(1.0, abs=1e-3)
    assert (tmp_path / "config.yaml").is_file() and any((tmp_path / "tensorboard").iterdir())
    step_dir = tmp_path / "checkpoints" / "step_2"
    assert (step_dir / "policy" / "model.safetensors").is_file() and (
        step_dir / "value" / "model.safetensors"
    ).is_file()


def test_colocated_run_with_critic_warm_up_warm_started_critic_and_rollout_dumps(
    data_dir: Path, tmp_path: Path, tiny_run_tree: Callable[..., dict[str, Any]], train_in_process: Train
):
    # A saved critic whose head is not zero: a warm start shows as non-zero pre-update values at step 1.
    base = resolve_model_path("tiny:tiny")
    critic = load_value_model(base)
    with torch.no_grad():
        value_head(critic).weight.fill_(0.05)
    save_value_model(critic, load_tokenizer(base), tmp_path / "critic")
    tree = tiny_run_tree(data_dir, policy_training_start_step=1, log_rollout_dump=True, rollout_dump_period=1)
    tree["value"]["warm_start_path"] = str(tmp_path / "critic")
    metrics = train_in_process(tree, tmp_path / "run")

    assert [m["step"] for m in metrics] == [1, 2]
    assert [m["train/policy_trained"] for m in metrics] == [0.0, 1.0]
    assert metrics[0]["mismatch/token_mult_prob_error"] == pytest.approx(1.0, abs=1e-3)
    assert abs(metrics[0]["critic/mean_v_early"]) > 1e-3
    assert "val/reward_mean" in metrics[-1]
    checkpoints = tmp_path / "run" / "checkpoints"
    assert not (checkpoints / "step_1" / "policy").exists()  # the policy has not trained yet: nothing to save
    assert (checkpoints / "step_2" / "policy" / "model.safetensors").is_file()
    assert load_run_state(checkpoints / "step_2").extra == {"value_warm_start": str(tmp_path / "critic")}
    dump = torch.load(tmp_path / "run" / "rollout_dumps" / "step_2.pt", weights_only=True)
    assert dump["step"] == 2 and len(dump["reward"]) == 8


def test_fresh_critic_predicts_zero_before_its_first_update_under_dynamic_sampling_and_the_step_is_recorded_in_text(
    data_dir: Path, tmp_path: Path, tiny_run_tree: Callable[..., dict[str, Any]], train_in_process: Train
):
    # Dynamic sampling rides along (wired from the config to the sync source): the step still trains 4 groups.
    tree = tiny_run_tree(
        data_dir,
        max_num_steps=1,
        use_dynamic_sampling=True,
        batch_multiplier=2,
        log_rollout_dump=True,
        rollout_dump_period=1,
    )
    metrics = train_in_process(tree, tmp_path)
    assert metrics[0]["critic/mean_v_early"] == 0.0
    assert metrics[0]["dynamic_sampling/num_gen_batches"] >= 1.0
    assert metrics[0]["train/num_samples"] == 8.0
    # The run records: one train data line per trained sample, and the dump's texts, decoded by the driver.
    samples = tree["ppo"]["num_prompts_per_step"] * tree["ppo"]["num_generations_per_prompt"]
    lines = (tmp_path / "train_data" / "train_data_step1.jsonl").read_text().splitlines()
    records = [json.loads(line) for line in lines]
    assert len(records) == samples and [r["sample_index"] for r in records] == list(range(samples))
    assert all(r["prompt"] and r["num_generated_tokens"] > 0 and r["trajectory_age"] == 0 for r in records)
    dump = torch.load(tmp_path / "rollout_dumps" / "step_1.pt", weights_only=True)
    assert [r["reward"] for r in records] == pytest.approx(dump["reward"].tolist())
    assert dump["content"][0].startswith(records[0]["prompt"]) and len(dump["content"]) == samples
    assert len(dump["token_text"]) == len(dump["token_ids"])


def test_stopped_and_resumed_run_repeats_the_uninterrupted_run_and_takes_a_changed_lr(
    data_dir: Path, tmp_path: Path, tiny_run_tree: Callable[..., dict[str, Any]], train_in_process: Train
):
    # Colocated (three runs of start-up are the cost); non-colocated resumes are covered by the async kill test.
    tree = tiny_run_tree(data_dir, max_num_steps=3)
    whole = train_in_process(tree, tmp_path / "whole")

    stopped = copy.deepcopy(tree)
    stopped["ppo"]["max_num_steps"] = 2
    train_in_process(stopped, tmp_path / "resumed")
    # A crash while writing step 3 leaves a half-written directory; resume must ignore it.
    half = tmp_path / "resumed" / "checkpoints" / "tmp_step_3"
    (half / "policy").mkdir(parents=True)
    (half / "policy" / "model.safetensors").write_bytes(b"partial")
    # The resume doubles the policy's LR (an allowed change): step 3 must train with it, from the saved moments.
    changed = copy.deepcopy(tree)
    lr = validate_tree(tree).model.optimizer.lr
    changed["model"]["optimizer"] = {"lr": 2 * lr}
    resumed = train_in_process(changed, tmp_path / "resumed")

    assert [m["step"] for m in resumed] == [1, 2, 3]  # metrics.jsonl continues, nothing duplicated
    # Same prompts consumed: the data position after step 3 is identical.
    whole_source = load_state(tmp_path / "whole" / "checkpoints" / "step_3" / "batch_source.pt")
    resumed_source = load_state(tmp_path / "resumed" / "checkpoints" / "step_3" / "batch_source.pt")
    assert whole_source == resumed_source
    # Same step-3 numbers (deterministic CPU fp32, per-step sampling seeds); wall-clock timings (and the throughput
    # derived from them) differ, the policy's LR doubled, and the validation after the step's update sees the update
    # the doubled LR made.
    third_whole, third_resumed = whole[2], resumed[2]
    assert third_resumed["policy/lr"] == pytest.approx(2 * third_whole["policy/lr"])
    compared = [
        key
        for key in third_whole
        if not key.startswith(("timing/", "val/", "perf/")) and key not in ("weight_sync/bytes", "policy/lr")
    ]
    differing = [key for key in compared if third_whole[key] != pytest.approx(third_resumed[key], rel=1e-5, abs=1e-6)]
    assert compared and differing == []

    # Adam's update is linear in the LR (no weight decay, same gradient and moments): step 3 moved every policy
    # weight exactly twice as far, which also shows the optimizer state was restored, not rebuilt.
    def policy(run: str, step: int) -> dict[str, torch.Tensor]:
        return load_file(tmp_path / run / "checkpoints" / f"step_{step}" / "policy" / "model.safetensors")

    before, after_whole, after_resumed = policy("whole", 2), policy("whole", 3), policy("resumed", 3)
    moved = max((after_whole[name] - before[name]).abs().max().item() for name in before)
    assert moved > 1e-6
    for name, weight in before.items():
        torch.testing.assert_close(after_resumed[name] - weight, 2 * (after_whole[name] - weight), rtol=1e-3, atol=2e-6)
    # The run directory keeps the config the run started with and records the resumed attempt's.
    run_dir = tmp_path / "resumed"
    started = yaml.safe_load((run_dir / "config.yaml").read_text())
    assert (started["ppo"]["max_num_steps"], started["model"]["optimizer"]["lr"]) == (2, lr)
    assert sorted(path.name for path in (run_dir / "config_history").iterdir()) == ["01_step2.yaml"]
    recorded = yaml.safe_load((run_dir / "config_history" / "01_step2.yaml").read_text())
    assert (recorded["ppo"]["max_num_steps"], recorded["model"]["optimizer"]["lr"]) == (3, 2 * lr)


def test_a_damaged_newest_checkpoint_is_passed_over_with_a_note_and_none_left_is_one_error_line(
    data_dir: Path,
    tmp_path: Path,
    tiny_run_tree: Callable[..., dict[str, Any]],
    capsys: pytest.CaptureFixture[str],
):
    from asyncppo.cli.main import main

    tree = tiny_run_tree(data_dir, max_num_steps=2)
    tree["checkpointing"]["save_period"] = 1
    config, run_dir = tmp_path / "run.yaml", tmp_path / "run"
    config.write_text(yaml.safe_dump(tree))
    assert main(["train", str(config), "--run-dir", str(run_dir)]) == 0
    weights = run_dir / "checkpoints" / "step_2" / "policy" / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[len(data) // 2] ^= 0xFF  # one flipped byte, the same file size
    weights.write_bytes(bytes(data))
    capsys.readouterr()
    assert main(["train", str(config), "--run-dir", str(run_dir), "ppo.max_num_steps=3"]) == 0
    out = capsys.readouterr().out
    assert (
        "note: step_2 failed verification (policy/model.safetensors: hash mismatch); resuming from step_1\n" in out
    ), out[-2000:]
    assert f"resumed from {run_dir / 'checkpoints' / 'step_1'} (step 1)" in out
    assert [record["step"] for record in read_metrics_jsonl(run_dir / "metrics.jsonl")][-2:] == [2, 3]

    for step in (1, 2, 3):  # every checkpoint damaged: nothing to resume from
        (run_dir / "checkpoints" / f"step_{step}" / "run_state.json").write_text("{}")
    assert main(["train", str(config), "--run-dir", str(run_dir), "ppo.max_num_steps=4"]) == 2
    captured = capsys.readouterr()
    assert captured.err.count("\n") == 1 and "Traceback" not in captured.err, captured.err
    assert captured.err.startswith("error: checkpointing: no checkpoint in ") and "verifies (step_1: " in captured.err
