"""Safe resume: config comparison as dotted keys, refused changes named with both values before any process
starts (through the CLI, exit 2), and the run directory's config history instead of an overwritten config.yaml."""

from pathlib import Path
from typing import Any

import pytest

from asyncppo.cli.main import main
from asyncppo.config import dump_config, load_config
from asyncppo.trainer.resume import (
    ABSENT,
    ConfigChange,
    check_resume,
    config_changes,
    history_entries,
    record_config,
    refused_changes,
)
from written_checkpoints import prompt_rows, write_run

REPO = Path(__file__).parents[2]
DEMO = str(REPO / "examples" / "configs" / "demo.yaml")
DATA = REPO / "examples" / "data" / "arithmetic"
# Absolute data paths: the run's config and the resumed attempt's must name the same files from any directory.
BASE = [f"data.train_path={DATA / 'train.jsonl'}", f"data.validation_path={DATA / 'validation.jsonl'}"]


def test_changes_are_dotted_keys_in_order_lists_compare_whole_and_missing_sections_are_absent() -> None:
    old: dict[str, Any] = {"model": {"lr": 1.0, "betas": [0.9, 0.99]}, "value": {"name": "x"}, "seed": 1}
    new: dict[str, Any] = {"model": {"lr": 2.0, "betas": [0.9, 0.999]}, "value": None, "seed": 1, "extra": {"a": 1}}
    assert config_changes(old, new) == [
        ConfigChange("extra", ABSENT, {"a": 1}),
        ConfigChange("model.betas", [0.9, 0.99], [0.9, 0.999]),
        ConfigChange("model.lr", 1.0, 2.0),
        ConfigChange("value", {"name": "x"}, None),
    ]
    assert config_changes(old, old) == []


def test_a_refused_change_names_the_key_both_values_and_the_fix() -> None:
    old = {"model": {"train_global_batch_size": 64, "model_name": "tiny:tiny"}, "value": {"model_name": None}}
    new = {"model": {"train_global_batch_size": 32, "model_name": "tiny:tiny"}, "value": None}
    assert refused_changes(old, new) == [
        "value.model_name: null in the run's config, (absent) now; the checkpoint holds that critic's weights: "
        "set it back to null or start a new run directory",
        "model.train_global_batch_size: 64 in the run's config, 32 now; a resumed run keeps its batch shape: "
        "set it back to 64 or start a new run directory",
    ]


def _started_run(run_dir: Path, step: int = 10, overrides: tuple[str, ...] = ()) -> str:
    """A run directory as a first attempt leaves it: config.yaml and checkpoint step_<step> (with its config), written
    by the run's own save path."""
    config = load_config(DEMO, [*BASE, *overrides])
    run_dir.mkdir(parents=True)
    (run_dir / "config.yaml").write_text(dump_config(config))
    write_run(config, run_dir, prompt_rows(64), save_at={step})
    return (run_dir / "config.yaml").read_text()


def _train(run_dir: Path, *overrides: str) -> int:
    return main(["train", DEMO, "--run-dir", str(run_dir), *BASE, *overrides])


REFUSED_RESUMES = [
    pytest.param(
        ["model.train_global_batch_size=32"],
        [
            "error: model.train_global_batch_size: 64 in the run's config, 32 now; a resumed run keeps its batch "
            "shape: set it back to 64 or start a new run directory"
        ],
        id="another_batch_size",
    ),
    pytest.param(
        ["ppo.max_num_steps=2", "data.shuffle=false"],
        [
            "error: ppo.max_num_steps: 2 is below the checkpoint's step 10 ({checkpoint}); raise it or start a new "
            "run directory",
            "error: data.shuffle: true in the run's config, false now; the checkpoint's prompt position counts rows "
            "in that order: set it back to true or start a new run directory",
        ],
        id="max_num_steps_below_the_checkpoint_and_another_row_order",
    ),
]


@pytest.mark.usefixtures("ray_tripwire")
@pytest.mark.parametrize(("overrides", "errors"), REFUSED_RESUMES)
def test_a_refused_resume_exits_2_naming_both_values_before_ray_starts_and_leaves_the_run_directory_alone(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], overrides: list[str], errors: list[str]
) -> None:
    run_dir = tmp_path / "run"
    started = _started_run(run_dir)
    assert _train(run_dir, *overrides) == 2
    checkpoint = run_dir / "checkpoints" / "step_10"
    assert capsys.readouterr().err.splitlines() == [line.format(checkpoint=checkpoint) for line in errors]
    assert (run_dir / "config.yaml").read_text() == started and not (run_dir / "config_history").exists()
    assert history_entries(run_dir) == []


def test_an_allowed_change_is_noted_and_recorded_once_and_an_equal_config_adds_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run_dir = tmp_path / "run"
    started = _started_run(run_dir)
    changed = load_config(DEMO, [*BASE, "model.optimizer.lr=1e-4", "ppo.max_num_steps=300"])
    plan = check_resume(changed, run_dir)
    assert (plan.checkpoint, plan.step) == (run_dir / "checkpoints" / "step_10", 10)
    written = record_config(changed, run_dir, plan)
    assert written == run_dir / "config_history" / "01_step10.yaml"
    assert written.read_text() == dump_config(changed) and (run_dir / "config.yaml").read_text() == started
    assert capsys.readouterr().out.splitlines() == [
        f"note: resuming from {plan.checkpoint} (step 10) with changed config keys: model.optimizer.lr 0.0003 -> "
        f"0.0001, ppo.max_num_steps 200 -> 300; recorded in {written}"
    ]
    # The same changed config again (an attempt that crashed before its next checkpoint): nothing new on disk.
    assert record_config(changed, run_dir, check_resume(changed, run_dir)) is None
    assert history_entries(run_dir) == [written]
    assert "recorded in" not in capsys.readouterr().out  # still noted: the checkpoint's config is the old one
    # Back to the run's own config: no note about the checkpoint, but the history records the switch back.
    same = load_config(DEMO, BASE)
    plan = check_resume(same, run_dir)
    assert plan.changes == []
    assert record_config(same, run_dir, plan) == run_dir / "config_history" / "02_step10.yaml"
    assert "note:" not in capsys.readouterr().out


def test_a_fresh_start_writes_config_yaml_and_no_history(tmp_path: Path) -> None:
    config = load_config(DEMO, BASE)
    plan = check_resume(config, tmp_path)
    assert (plan.checkpoint, plan.step, plan.changes) == (None, 0, [])
    assert record_config(config, tmp_path, plan) == tmp_path / "config.yaml"
    assert (tmp_path / "config.yaml").read_text() == dump_config(config) and history_entries(tmp_path) == []
