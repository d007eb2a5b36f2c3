"""The manager's side of checkpoint integrity, on checkpoints written through its protocol: damage to a file, to the
manifest or to the completion marker, and what the owner's cross-check refuses, are passed over by `latest()`, which
names each and falls back to the newest checkpoint that verifies, or raises one line when none does. The run's own
checkpoints, every kind of damage the issue lists and the run state's cross-check with the books are
tests/trainer/test_checkpoint_integrity.py."""

from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from asyncppo.checkpoint import (
    RUN_STATE_FILE,
    TRAINING_INFO_FILE,
    CheckpointDamagedError,
    CheckpointManager,
    RunState,
    save_run_state,
    save_state,
)
from asyncppo.checkpoint.manifest import MANIFEST_FILE, damage_in

WEIGHTS = "policy/model.safetensors"
OPTIMIZER = "policy/optimizer.pt"
BUFFER = "batch_source.pt"


def _save(manager: CheckpointManager, step: int) -> Path:
    directory = manager.begin(step)
    (directory / "policy").mkdir()
    generator = torch.Generator().manual_seed(step)
    save_file({"weight": torch.randn(64, 64, generator=generator)}, directory / WEIGHTS)
    save_state(directory / OPTIMIZER, {"exp_avg": torch.randn(64, 64, generator=generator), "step": step})
    save_state(directory / BUFFER, {"buffered": list(range(step * 4)), "next_draw_id": step * 4})
    save_run_state(directory, RunState(step=step, epoch=0, num_consumed_prompts=step * 4, extra={}))
    return manager.finalize(step, {})


def _flip_bytes(path: Path) -> None:
    data = bytearray(path.read_bytes())
    middle = len(data) // 2
    data[middle : middle + 16] = bytes(value ^ 0xFF for value in data[middle : middle + 16])
    path.write_bytes(bytes(data))  # the same size: only a hash tells


DAMAGE: dict[str, tuple[str, Callable[[Path], None], str]] = {
    "flipped_weights": (WEIGHTS, _flip_bytes, f"{WEIGHTS}: hash mismatch"),
    "truncated_buffer_state": (BUFFER, lambda path: path.write_bytes(path.read_bytes()[:-100]), f"{BUFFER}: size"),
    "deleted_optimizer_state": (OPTIMIZER, Path.unlink, f"{OPTIMIZER}: missing"),
    "deleted_manifest": (MANIFEST_FILE, Path.unlink, f"{MANIFEST_FILE}: missing"),
    "unreadable_manifest": (MANIFEST_FILE, lambda path: path.write_text("[]"), f"{MANIFEST_FILE}: unreadable"),
    "broken_completion_marker": (TRAINING_INFO_FILE, lambda path: path.write_text("{not json"), "unreadable"),
}


@pytest.mark.parametrize("kind", list(DAMAGE))
def test_damage_to_the_newest_checkpoint_falls_back_to_the_previous_one_naming_it(kind: str, tmp_path: Path):
    manager = CheckpointManager(tmp_path, keep_top_k=None, metric_name=None, higher_is_better=True)
    first, newest = _save(manager, 1), _save(manager, 2)
    assert damage_in(newest) is None
    name, damage, reason = DAMAGE[kind]
    damage(newest / name)
    # A new manager, as a resumed run builds: it trusts nothing it did not write.
    reader = CheckpointManager(tmp_path, keep_top_k=None, metric_name=None, higher_is_better=True)
    assert reader.latest() == first
    assert list(reader.rejected) == [2] and reason in reader.rejected[2], reader.rejected


def test_a_checkpoint_the_cross_check_refuses_is_passed_over_and_each_is_checked_once(tmp_path: Path):
    writer = CheckpointManager(tmp_path, keep_top_k=None, metric_name=None, higher_is_better=True)
    first, _ = _save(writer, 1), _save(writer, 2)
    asked: list[str] = []

    def cross_check(checkpoint: Path) -> str | None:
        asked.append(checkpoint.name)
        return "run_state.json: disagrees with the books" if checkpoint.name == "step_2" else None

    reader = CheckpointManager(tmp_path, None, None, True, cross_check=cross_check)
    assert reader.latest() == first and reader.latest() == first
    assert reader.rejected == {2: "run_state.json: disagrees with the books"}
    assert asked == ["step_2", "step_1"]  # once each, however often the run asks


def test_a_manager_makes_its_directory_only_when_it_first_saves(tmp_path: Path):
    manager = CheckpointManager(tmp_path / "checkpoints", keep_top_k=None, metric_name=None, higher_is_better=True)
    assert manager.latest() is None and not (tmp_path / "checkpoints").exists()
    _save(manager, 1)
    assert manager.latest() == tmp_path / "checkpoints" / "step_1"


def test_when_no_checkpoint_verifies_the_error_is_one_line_naming_each(tmp_path: Path):
    manager = CheckpointManager(tmp_path, keep_top_k=None, metric_name=None, higher_is_better=True)
    first, newest = _save(manager, 1), _save(manager, 2)
    _flip_bytes(first / WEIGHTS)
    (newest / OPTIMIZER).unlink()
    reader = CheckpointManager(tmp_path, keep_top_k=None, metric_name=None, higher_is_better=True)
    with pytest.raises(CheckpointDamagedError) as raised:
        reader.latest()
    message = str(raised.value)
    assert "\n" not in message
    assert f"step_1: {WEIGHTS}: hash mismatch; step_2: {OPTIMIZER}: missing" in message


def test_the_manifest_lists_every_file_but_itself_and_the_completion_marker(tmp_path: Path):
    manager = CheckpointManager(tmp_path, keep_top_k=None, metric_name=None, higher_is_better=True)
    step = _save(manager, 1)
    listed = (step / MANIFEST_FILE).read_text()
    for name in (WEIGHTS, OPTIMIZER, BUFFER, RUN_STATE_FILE):
        assert f'"{name}"' in listed
    assert TRAINING_INFO_FILE not in listed
