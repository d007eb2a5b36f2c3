"""CheckpointManager: the tmp -> step rename protocol, latest(), overwrite, crash recovery and keep-top-k pruning."""

import json

import pytest

from asyncppo.checkpoint import TRAINING_INFO_FILE, CheckpointManager


def save(manager: CheckpointManager, step: int, metrics: dict[str, float] | None = None, payload: str = "w"):
    path = manager.begin(step)
    (path / "policy").mkdir()
    (path / "policy" / "weights.txt").write_text(payload)
    return manager.finalize(step, metrics or {})


def step_names(manager: CheckpointManager) -> list[str]:
    return [record.path.name for record in manager.checkpoints()]


def test_latest_ignores_half_written_tmp_and_unmarked_step_dirs(tmp_path):
    manager = CheckpointManager(tmp_path, keep_top_k=None, metric_name=None, higher_is_better=True)
    save(manager, 2)
    half = manager.begin(3)  # a crash before finalize leaves this behind
    (half / "policy").mkdir()
    (tmp_path / "step_4" / "policy").mkdir(parents=True)  # a step dir without training_info.json
    (tmp_path / "step_notanumber").mkdir()
    assert manager.latest() == tmp_path / "step_2"
    assert step_names(manager) == ["step_2"]


def test_latest_orders_by_step_number_not_by_name(tmp_path):
    manager = CheckpointManager(tmp_path, keep_top_k=None, metric_name=None, higher_is_better=True)
    for step in (9, 10, 2):
        save(manager, step)
    assert manager.latest() == tmp_path / "step_10"


def test_empty_directory_has_no_latest(tmp_path):
    manager = CheckpointManager(tmp_path / "new", keep_top_k=2, metric_name=None, higher_is_better=True)
    assert manager.latest() is None


def test_finalize_renames_and_writes_training_info(tmp_path):
    manager = CheckpointManager(tmp_path, keep_top_k=None, metric_name="val:accuracy", higher_is_better=True)
    final = save(manager, 5, {"val/accuracy": 0.25, "train/loss": 1.0})
    assert final == tmp_path / "step_5"
    assert not (tmp_path / "tmp_step_5").exists()
    info = json.loads((final / TRAINING_INFO_FILE).read_text())
    assert info["step"] == 5
    assert info["val:accuracy"] == 0.25
    assert "timestamp" in info
    assert (final / "policy" / "weights.txt").read_text() == "w"


def test_begin_removes_a_stale_tmp_dir(tmp_path):
    manager = CheckpointManager(tmp_path, keep_top_k=None, metric_name=None, higher_is_better=True)
    stale = manager.begin(7)
    (stale / "leftover.pt").write_text("half")
    fresh = manager.begin(7)
    assert fresh == stale
    assert list(fresh.iterdir()) == []


def test_finalize_without_begin_is_an_error(tmp_path):
    manager = CheckpointManager(tmp_path, keep_top_k=None, metric_name=None, higher_is_better=True)
    with pytest.raises(ValueError, match="without begin"):
        manager.finalize(3, {})


def test_overwriting_an_existing_step_replaces_its_contents(tmp_path):
    manager = CheckpointManager(tmp_path, keep_top_k=None, metric_name=None, higher_is_better=True)
    save(manager, 4, payload="first")
    save(manager, 4, payload="second")
    assert (tmp_path / "step_4" / "policy" / "weights.txt").read_text() == "second"
    assert sorted(path.name for path in tmp_path.iterdir()) == ["step_4"]


def test_a_crash_mid_overwrite_is_recovered_on_startup(tmp_path):
    manager = CheckpointManager(tmp_path, keep_top_k=None, metric_name=None, higher_is_better=True)
    save(manager, 4, payload="old")
    save(manager, 6, payload="old")
    # Step 4: crashed after moving the old copy aside, with the new copy complete -> the new copy wins.
    (tmp_path / "step_4").rename(tmp_path / "old_step_4")
    new = manager.begin(4)
    (new / "weights.txt").write_text("new")
    (new / TRAINING_INFO_FILE).write_text('{"step": 4}')
    # Step 6: crashed after moving aside, new copy incomplete -> the old copy is put back.
    (tmp_path / "step_6").rename(tmp_path / "old_step_6")
    manager.begin(6)
    recovered = CheckpointManager(tmp_path, keep_top_k=None, metric_name=None, higher_is_better=True)
    assert step_names(recovered) == ["step_4", "step_6"]
    assert (tmp_path / "step_4" / "weights.txt").read_text() == "new"
    assert (tmp_path / "step_6" / "policy" / "weights.txt").read_text() == "old"
    assert not list(tmp_path.glob("old_step_*"))


def test_keep_top_k_by_val_metric_with_ties_to_the_newer_and_the_latest_kept(tmp_path):
    manager = CheckpointManager(tmp_path, keep_top_k=2, metric_name="val:accuracy", higher_is_better=True)
    # accuracy: step 1 -> 0.5, step 2 -> 0.9, step 3 -> 0.5 (ties step 1; newer wins), step 4 -> 0.1 (latest).
    save(manager, 1, {"val/accuracy": 0.5})
    save(manager, 2, {"val/accuracy": 0.9})
    save(manager, 3, {"val/accuracy": 0.5})
    assert step_names(manager) == ["step_2", "step_3"]
    save(manager, 4, {"val/accuracy": 0.1})
    # Top 2 are steps 2 and 3; step 4 is worst but is the latest, so it stays as the (k+1)-th.
    assert step_names(manager) == ["step_2", "step_3", "step_4"]
    save(manager, 5, {"val/accuracy": 0.95})
    # Top 2 now steps 5 and 2; step 4 is no longer the latest and goes, step 3 falls out of the top 2.
    assert step_names(manager) == ["step_2", "step_5"]


def test_lower_is_better_keeps_the_smallest_values(tmp_path):
    manager = CheckpointManager(tmp_path, keep_top_k=1, metric_name="train:loss", higher_is_better=False)
    save(manager, 1, {"train:loss": 0.3})
    save(manager, 2, {"train:loss": 0.1})
    save(manager, 3, {"train:loss": 0.2})
    # step 2 is best; step 3 is the latest.
    assert step_names(manager) == ["step_2", "step_3"]


def test_checkpoints_without_the_metric_or_with_nan_are_pruned_first(tmp_path):
    manager = CheckpointManager(tmp_path, keep_top_k=2, metric_name="val:accuracy", higher_is_better=True)
    save(manager, 1, {"val/accuracy": 0.2})
    save(manager, 2, {})  # no validation this step
    save(manager, 3, {"val/accuracy": float("nan")})
    assert json.loads((tmp_path / "step_3" / TRAINING_INFO_FILE).read_text())["val:accuracy"] is None
    save(manager, 4, {"val/accuracy": 0.1})
    # Ranked: 1 (0.2), 4 (0.1); unranked: 3, 2. Keep two ranked ones; 4 is also the latest.
    assert step_names(manager) == ["step_1", "step_4"]


def test_without_a_metric_the_newest_k_are_kept(tmp_path):
    manager = CheckpointManager(tmp_path, keep_top_k=2, metric_name=None, higher_is_better=True)
    for step in range(1, 5):
        save(manager, step, {"val/accuracy": float(-step)})
    assert step_names(manager) == ["step_3", "step_4"]


@pytest.mark.parametrize(
    ("keep_top_k", "metric_name", "message"),
    [(0, None, "keep_top_k"), (None, "accuracy", "metric_name"), (None, "val:", "metric_name")],
)
def test_bad_arguments_are_rejected(tmp_path, keep_top_k, metric_name, message):
    with pytest.raises(ValueError, match=message):
        CheckpointManager(tmp_path, keep_top_k=keep_top_k, metric_name=metric_name, higher_is_better=True)
