"""Checkpoint integrity on real checkpoints (`written_checkpoints.py`: the run's own save path, an async run's buffer,
policy and critic workers trained in-process): each kind of damage to the newest checkpoint (flipped bytes of the
same size in the policy weights, the optimizer state or the buffer state, a truncated file, a deleted file, an edited
step in the run state, with or without a manifest rewritten to match) is found before any process starts, named on
one note line, and the run resumes from the previous checkpoint, restoring it; with none left that verifies, one
error line (exit 2 through the CLI). `--resume-from` chooses one by hand, and the run state's epoch is counted."""

import hashlib
import json
import re
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml

from asyncppo.checkpoint import RUN_STATE_FILE, TRAINING_INFO_FILE, load_run_state, load_state
from asyncppo.checkpoint import manifest as manifest_module
from asyncppo.checkpoint.manifest import MANIFEST_FILE, write_manifest
from asyncppo.cli.main import main
from asyncppo.config import ConfigError, RunConfig, validate_tree
from asyncppo.trainer.resume import ResumePlan, check_resume, prepare_checkpoints
from asyncppo.trainer.run_checkpoints import RunCheckpoints, prompt_position
from asyncppo.trainer.run_inputs import batch_source
from ppo_settings import tiny_run_tree
from written_checkpoints import InProcessWorkers, in_process_workers, instant_rollouts, prompt_rows, write_run

ROWS = 6  # 3 batches of 2 prompts per epoch: 3 steps reach the second epoch
WEIGHTS, OPTIMIZER, BUFFER = "policy/model.safetensors", "policy/optimizer.pt", "batch_source.pt"


def _tree(train_path: Path, run_dir: Path, *, asynchronous: bool = True) -> dict[str, Any]:
    tree = tiny_run_tree(str(train_path))
    tree["ppo"]["max_num_steps"] = 10
    tree["logger"] = {"log_dir": str(run_dir), "console": False}
    if asynchronous:
        tree["ppo"]["async_ppo"] = {"enabled": True, "max_trajectory_age_steps": 1}
        tree["generation"]["colocated"] = {"enabled": False}
        tree["loss_fn"] = {"use_importance_sampling_correction": True}
    return tree


@pytest.fixture(scope="module")
def written(tmp_path_factory: pytest.TempPathFactory, shared_cache_dir: Path) -> Iterator[tuple[RunConfig, Path]]:
    """An async run's config and its run directory with checkpoints step_1, step_2 and step_3 (copy it to damage it)."""
    root = tmp_path_factory.mktemp("written")
    train_path = root / "train.jsonl"
    train_path.write_text("".join(json.dumps(row) + "\n" for row in prompt_rows(ROWS)))
    run_dir = root / "run"
    config = validate_tree(_tree(train_path, run_dir))
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("ASYNCPPO_CACHE_DIR", str(shared_cache_dir))
        write_run(config, run_dir, prompt_rows(ROWS), save_at={1, 2, 3}, workers=in_process_workers(config))
    yield config, run_dir


@pytest.fixture
def run_dir(written: tuple[RunConfig, Path], tmp_path: Path) -> Path:
    """A fresh copy of the written run directory, for one test to damage."""
    return Path(shutil.copytree(written[1], tmp_path / "run"))


def _resume(config: RunConfig, run_dir: Path, resume_from: str | None = None) -> ResumePlan:
    plan = check_resume(config, run_dir, resume_from)
    prepare_checkpoints(plan)
    return plan


def _flip_bytes(path: Path) -> None:
    data = bytearray(path.read_bytes())
    middle = len(data) // 2
    data[middle : middle + 4096] = bytes(value ^ 0xFF for value in data[middle : middle + 4096])
    path.write_bytes(bytes(data))  # the same size: only a hash tells


def _truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[:-100])


def _edit_run_state(path: Path, **changes: int) -> None:
    """Change numbers in place, as an editor would (one digit for one: the same file size)."""
    text = path.read_text()
    for key, value in changes.items():
        text, count = re.subn(rf'"{key}": \d+', f'"{key}": {value}', text)
        assert count == 1, (key, text)
    path.write_text(text)


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _rewrite_manifest(checkpoint: Path) -> None:
    """What a careful forger does after an edit: the manifest then matches the files again."""
    (checkpoint / MANIFEST_FILE).unlink()
    write_manifest(checkpoint)


def _edited_step_with_manifest(checkpoint: Path) -> None:
    _edit_run_state(checkpoint / RUN_STATE_FILE, step=2)
    _rewrite_manifest(checkpoint)


def _edited_epoch_with_manifest(checkpoint: Path) -> None:
    _edit_run_state(checkpoint / RUN_STATE_FILE, epoch=0)
    _rewrite_manifest(checkpoint)


def _bad_json_with_manifest(checkpoint: Path) -> None:
    (checkpoint / RUN_STATE_FILE).write_text('{"step": 3,')
    _rewrite_manifest(checkpoint)


DAMAGE: dict[str, tuple[Callable[[Path], None], str]] = {
    # each: what is done to step_3, and the reason its note gives
    "flipped_policy_weights": (lambda step: _flip_bytes(step / WEIGHTS), f"{WEIGHTS}: hash mismatch"),
    "flipped_optimizer_state": (lambda step: _flip_bytes(step / OPTIMIZER), f"{OPTIMIZER}: hash mismatch"),
    "flipped_buffer_state": (lambda step: _flip_bytes(step / BUFFER), f"{BUFFER}: hash mismatch"),
    "truncated_critic_weights": (
        lambda step: _truncate(step / "value/model.safetensors"),
        "value/model.safetensors: size",
    ),
    "deleted_rng_state": (lambda step: (step / "rng.pt").unlink(), "rng.pt: missing"),
    "edited_run_state_step": (
        lambda step: _edit_run_state(step / RUN_STATE_FILE, step=2),
        f"{RUN_STATE_FILE}: hash mismatch",
    ),
    "edited_run_state_step_and_manifest": (_edited_step_with_manifest, f"{RUN_STATE_FILE}: step 2 in the directory"),
    "edited_run_state_epoch_and_manifest": (
        _edited_epoch_with_manifest,
        f"{RUN_STATE_FILE}: epoch 0, but the prompt stream in {BUFFER} says 1",
    ),
    "bad_run_state_json_and_manifest": (_bad_json_with_manifest, f"{RUN_STATE_FILE}: unreadable (JSONDecodeError"),
}


@pytest.mark.parametrize("kind", list(DAMAGE))
def test_damage_to_the_newest_checkpoint_is_one_note_and_the_run_resumes_from_the_previous_one(
    kind: str, written: tuple[RunConfig, Path], run_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    damage, reason = DAMAGE[kind]
    damage(run_dir / "checkpoints" / "step_3")
    plan = _resume(written[0], run_dir)
    assert (plan.checkpoint, plan.step) == (run_dir / "checkpoints" / "step_2", 2)
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 1 and lines[0].startswith("note: step_3 failed verification (") and reason in lines[0], lines
    assert lines[0].endswith("); resuming from step_2")


def test_a_forged_checkpoint_whose_every_marker_says_the_step_is_caught_by_the_books(
    written: tuple[RunConfig, Path], run_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # The case done thoroughly: step_3 passed off as step_2 (the run would retrain a step): the run state,
    # the completion marker, the directory's name and the manifest all agree; only the books know 6 prompts trained.
    checkpoints = run_dir / "checkpoints"
    shutil.rmtree(checkpoints / "step_2")
    forged = (checkpoints / "step_3").rename(checkpoints / "step_2")
    _edit_run_state(forged / RUN_STATE_FILE, step=2)
    _edit_run_state(forged / TRAINING_INFO_FILE, step=2)
    _rewrite_manifest(forged)
    plan = _resume(written[0], run_dir)
    assert plan.step == 1
    assert capsys.readouterr().out.splitlines() == [
        f"note: step_2 failed verification ({RUN_STATE_FILE}: step 2 x 2 prompts per step = 4 prompts trained, but "
        f"the books ({BUFFER}) hold 6); resuming from step_1"
    ]


def test_the_fallback_checkpoint_restores_into_the_run(
    written: tuple[RunConfig, Path], run_dir: Path, shared_cache_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = written[0]
    _flip_bytes(run_dir / "checkpoints" / "step_3" / WEIGHTS)
    plan = _resume(config, run_dir)
    monkeypatch.setenv("ASYNCPPO_CACHE_DIR", str(shared_cache_dir))
    workers: InProcessWorkers = in_process_workers(config)
    source = batch_source(config, prompt_rows(ROWS), instant_rollouts(2), lambda _: None, start_step=plan.step)
    policy: Any = workers.policy  # in-process workers stand in for their groups
    restored = RunCheckpoints(plan.manager, config, policy, workers.value, source, resume_from=plan.checkpoint)
    try:
        assert restored.restore() == 2
        saved = load_state(run_dir / "checkpoints" / "step_2" / BUFFER)
        assert source.state_dict()["collector"]["next_draw_id"] == saved["collector"]["next_draw_id"]
        optimizer = torch.load(run_dir / "checkpoints" / "step_2" / OPTIMIZER, weights_only=True)
        assert optimizer["state"]  # the Adam moments of real training steps, saved and now restored
        assert restored.latest() == run_dir / "checkpoints" / "step_2"  # what a stop line names
    finally:
        source.close()


def test_with_no_checkpoint_that_verifies_the_error_is_one_line_naming_each(
    written: tuple[RunConfig, Path], run_dir: Path
) -> None:
    for step in (1, 2, 3):
        _flip_bytes(run_dir / "checkpoints" / f"step_{step}" / OPTIMIZER)
    with pytest.raises(ConfigError) as raised:
        _resume(written[0], run_dir)
    (line,) = raised.value.lines
    assert line.startswith(f"checkpointing: no checkpoint in {run_dir / 'checkpoints'} verifies (step_1: ")
    assert f"step_3: {OPTIMIZER}: hash mismatch)" in line


def test_a_resume_hashes_each_file_of_its_checkpoint_once(
    written: tuple[RunConfig, Path], run_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    hashed: list[Path] = []
    real_sha256 = manifest_module._sha256  # pyright: ignore[reportPrivateUsage]

    def counting_sha256(path: Path) -> str:
        hashed.append(path)
        return real_sha256(path)

    monkeypatch.setattr(manifest_module, "_sha256", counting_sha256)
    plan = _resume(written[0], run_dir)
    assert plan.manager is not None and plan.checkpoint is not None
    # What else asks during the run (the restore takes the plan's checkpoint; a stop line asks for the latest).
    assert plan.manager.latest() == plan.checkpoint and plan.manager.verify(plan.checkpoint) is None
    listed = json.loads((plan.checkpoint / MANIFEST_FILE).read_text())["files"]
    assert sorted(hashed) == sorted(plan.checkpoint / name for name in listed)


def test_resume_from_step_n_takes_it_and_sets_the_later_checkpoints_aside(
    written: tuple[RunConfig, Path], run_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    checkpoints = run_dir / "checkpoints"
    plan = _resume(written[0], run_dir, "step_1")
    assert (plan.checkpoint, plan.step) == (checkpoints / "step_1", 1)
    assert capsys.readouterr().out.splitlines() == [
        f"note: resuming from {checkpoints / 'step_1'} (--resume-from); the run's later checkpoints step_2, step_3 "
        f"are set aside in {checkpoints / 'set_aside'}"
    ]
    assert sorted(path.name for path in (checkpoints / "set_aside").iterdir()) == ["step_2", "step_3"]
    assert plan.manager is not None and plan.manager.latest() == checkpoints / "step_1"  # what a plain resume takes


def test_resume_from_a_copy_elsewhere_sets_aside_the_run_s_own_checkpoint_of_that_step(
    written: tuple[RunConfig, Path], run_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    copy = Path(shutil.copytree(run_dir / "checkpoints" / "step_2", tmp_path / "backup" / "step_2"))
    plan = _resume(written[0], run_dir, str(copy))
    assert (plan.checkpoint, plan.step) == (copy, 2)
    assert "step_2, step_3 are set aside" in capsys.readouterr().out
    assert [path.name for path in (run_dir / "checkpoints").glob("step_*")] == ["step_1"]


@pytest.mark.parametrize(
    ("choice", "expected"),
    [
        (
            "step_9",
            "--resume-from: 'step_9': no directory {checkpoints}/step_9 (checkpoints in {checkpoints}: step_1, "
            "step_2, step_3)",
        ),
        ("{checkpoints}/step_3/policy", "--resume-from: {checkpoints}/step_3/policy is not a complete checkpoint"),
        ("step_3", f"--resume-from: {{checkpoints}}/step_3 failed verification ({WEIGHTS}: hash mismatch)"),
    ],
    ids=["missing", "not_a_checkpoint", "damaged"],
)
def test_a_resume_from_that_cannot_be_used_is_one_error_line_naming_it(
    written: tuple[RunConfig, Path], run_dir: Path, choice: str, expected: str
) -> None:
    checkpoints = run_dir / "checkpoints"
    _flip_bytes(checkpoints / "step_3" / WEIGHTS)
    before = {path: _digest(path) for path in checkpoints.rglob("*") if path.is_file()}
    with pytest.raises(ConfigError) as raised:
        _resume(written[0], run_dir, choice.format(checkpoints=checkpoints))
    (line,) = raised.value.lines
    assert line.startswith(expected.format(checkpoints=checkpoints)), line
    assert {path: _digest(path) for path in checkpoints.rglob("*") if path.is_file()} == before  # nothing moved


@pytest.mark.usefixtures("ray_tripwire")
def test_through_the_cli_a_bad_resume_from_exits_2_with_one_line_before_ray_starts(
    written: tuple[RunConfig, Path],
    run_dir: Path,
    tmp_path: Path,
    shared_cache_dir: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv("ASYNCPPO_CACHE_DIR", str(shared_cache_dir))
    config = tmp_path / "run.yaml"
    config.write_text(yaml.safe_dump(_tree(Path(written[0].data.train_path or ""), run_dir)))
    assert main(["train", str(config), "--run-dir", str(run_dir), "--resume-from", "step_7"]) == 2
    captured = capsys.readouterr()
    assert captured.err.splitlines() == [
        f"error: --resume-from: 'step_7': no directory {run_dir / 'checkpoints' / 'step_7'} (checkpoints in "
        f"{run_dir / 'checkpoints'}: step_1, step_2, step_3)"
    ]


@pytest.mark.parametrize("asynchronous", [True, False], ids=["async", "sync"])
def test_the_run_state_counts_epochs_and_prompts_as_the_prompt_stream_does(asynchronous: bool, tmp_path: Path) -> None:
    # 6 rows, 2 prompts per step: 4 steps train 8 prompts, so the stream is in its second epoch (epoch 1) or later
    # (async: the collector draws ahead of the steps).
    config = validate_tree(_tree(tmp_path / "train.jsonl", tmp_path / "run", asynchronous=asynchronous))
    (checkpoint,) = write_run(config, tmp_path / "run", prompt_rows(ROWS), save_at={4})
    state = load_run_state(checkpoint)
    stream = prompt_position(load_state(checkpoint / BUFFER))
    assert (state.epoch, state.num_consumed_prompts) == (stream["epoch"], stream["num_prompts_consumed"])
    assert state.epoch >= 1 and state.num_consumed_prompts >= 8
    if not asynchronous:
        assert (state.epoch, state.num_consumed_prompts) == (1, 8)
