"""Safe resume: a resumed attempt's config is checked against its checkpoint's before any process starts, and the
run directory keeps every config the run has used instead of overwriting one file. Called by `build_run`.

    run_dir/config.yaml                     the config the run started with: written once, right before the
                                            workers of its first attempt start (a fresh start rewrites it)
    run_dir/config_history/NN_stepS.yaml    each resumed attempt whose config differs from the last one
                                            recorded (NN = 01, 02, ... in order; S = the step it resumed from)

The checkpoint resumed is the newest one that verifies (its manifest, then its run state against its books:
`run_checkpoints.py`), or the one `--resume-from` names, which must verify; each is hashed once, by the run's own
checkpoint manager, which the plan hands on. Right before processes start, `prepare_checkpoints` names each newer
checkpoint passed over (`note: step_40 failed verification (...); resuming from step_38`) and sets aside the
run's checkpoints after one chosen by hand, so a later plain resume cannot pick one of that abandoned future.

An attempt that fails its checks writes nothing. The resume's reference is the checkpoint's own `config.yaml`
(every checkpoint saves the config it was written under, so a checkpoint directory alone knows its config; the
run directory's `config.yaml` stands in for a checkpoint without one). Keys in `REFUSED_CHANGES` hold what the
checkpoint's state was built on (weights, batch shape, the prompt order and position, the batch source's kind,
the critic's targets): changing one is an error naming the old and new values. Every other change is allowed,
printed as one `note:` line and recorded in the history. Configs compare as nested dicts; lists compare whole.
"""

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import yaml

from asyncppo.checkpoint import CheckpointDamagedError, CheckpointError, CheckpointManager, load_run_state
from asyncppo.config import ConfigError, RunConfig, dump_config
from asyncppo.trainer.run_checkpoints import CONFIG_FILE, checkpoint_manager

HISTORY_DIR = "config_history"
_HISTORY_ENTRY = re.compile(r"(\d+)_step(\d+)\.yaml")

_BATCH_SHAPE = "a resumed run keeps its batch shape"
_PROMPT_ORDER = "the checkpoint's prompt position counts rows in that order"
_SOURCE_STATE = "the checkpoint's batch source (data position, buffer, books) belongs to that mode"
REFUSED_CHANGES: dict[str, str] = {
    "model.model_name": "the checkpoint holds that model's weights",
    "model.tokenizer": "the checkpoint's weights and buffered token ids come from that tokenizer",
    "value.model_name": "the checkpoint holds that critic's weights",
    "value.tokenizer": "the checkpoint's critic reads that tokenizer's ids",
    "model.train_global_batch_size": _BATCH_SHAPE,
    "value.train_global_batch_size": _BATCH_SHAPE,
    "ppo.num_prompts_per_step": _BATCH_SHAPE,
    "ppo.num_generations_per_prompt": _BATCH_SHAPE,
    "model.max_total_sequence_length": "buffered rollouts and the batch shape were cut to it",
    "data.train_path": _PROMPT_ORDER,
    "data.dataset": _PROMPT_ORDER,
    "data.dataset_config": _PROMPT_ORDER,
    "data.split": _PROMPT_ORDER,
    "data.revision": _PROMPT_ORDER,
    "data.validation_fraction": _PROMPT_ORDER,
    "data.shuffle": _PROMPT_ORDER,
    "ppo.seed": "the prompt order and every step's sampling seed derive from it",
    "ppo.async_ppo.enabled": _SOURCE_STATE,
    "generation.colocated.enabled": _SOURCE_STATE,
    "env.should_use_nemo_gym": "buffered rollouts and the prompt rows belong to that environment",
    "ppo.adv_estimator.name": "the checkpoint's critic was trained on that estimator's targets",
    "ppo.adv_estimator.residual_baseline": "the checkpoint's critic predicts residual or absolute returns by it",
}


class _Absent:
    """A key one of the two configs lacks (a section that is null there, or a key of another schema version)."""

    def __repr__(self) -> str:
        return "(absent)"


ABSENT = _Absent()


@dataclass(frozen=True)
class ConfigChange:
    """One key whose value differs: its dotted path, the reference value and the new value (ABSENT if missing)."""

    key: str
    old: object
    new: object


def shown(value: object) -> str:
    """A value as a config file or a command-line override spells it (JSON: null, true, "text")."""
    return repr(value) if value is ABSENT else json.dumps(value)


def _is_tree(value: object) -> bool:
    return isinstance(value, dict)


def config_changes(old: Mapping[str, Any], new: Mapping[str, Any], prefix: str = "") -> list[ConfigChange]:
    """Every dotted key whose value differs between two config trees, in key order; lists compare whole."""
    changes: list[ConfigChange] = []
    for key in sorted(old.keys() | new.keys()):
        path = f"{prefix}{key}"
        before, after = old.get(key, ABSENT), new.get(key, ABSENT)
        if _is_tree(before) and _is_tree(after):
            changes.extend(config_changes(cast(dict[str, Any], before), cast(dict[str, Any], after), f"{path}."))
        elif before != after:
            changes.append(ConfigChange(path, before, after))
    return changes


def _lookup(tree: Mapping[str, Any], dotted: str) -> object:
    node: object = tree
    for part in dotted.split("."):
        if not _is_tree(node):
            return ABSENT
        node = cast(dict[str, Any], node).get(part, ABSENT)
    return node


def refused_changes(old: Mapping[str, Any], new: Mapping[str, Any]) -> list[str]:
    """One error line per key of REFUSED_CHANGES whose value differs, with both values and the fix."""
    lines: list[str] = []
    for key, reason in REFUSED_CHANGES.items():
        before, after = _lookup(old, key), _lookup(new, key)
        if before != after:
            lines.append(
                f"{key}: {shown(before)} in the run's config, {shown(after)} now; {reason}: "
                f"set it back to {shown(before)} or start a new run directory"
            )
    return lines


@dataclass(frozen=True)
class ResumePlan:
    """What `check_resume` found: the checkpoint to resume (None: a fresh start), its step, the allowed changes, and
    the run's checkpoint manager, which verified it."""

    checkpoint: Path | None
    step: int
    changes: list[ConfigChange]
    manager: CheckpointManager | None = None
    """The run's checkpoint manager (None: checkpointing off); the run saves through it and trusts what it verified."""
    chosen_by_hand: bool = False
    """Whether `--resume-from` named the checkpoint."""


def _read_tree(path: Path) -> dict[str, Any]:
    try:
        tree = yaml.safe_load(path.read_text())
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as error:
        raise ConfigError(
            [f"{path}: cannot read the run's config ({type(error).__name__}); restore it or start a new run directory"]
        ) from error
    if not _is_tree(tree):
        raise ConfigError(
            [f"{path}: holds {type(tree).__name__}, not a config mapping; restore it or start a new run directory"]
        )
    return cast(dict[str, Any], tree)


def _config_tree(config: RunConfig) -> dict[str, Any]:
    # Through the same YAML round trip as the saved files, so equal configs compare equal (tuples, floats).
    return cast(dict[str, Any], yaml.safe_load(dump_config(config)))


def find_resume_checkpoint(manager: CheckpointManager | None, resume_from: str | None = None) -> Path | None:
    """The checkpoint this run resumes from: the one `resume_from` names, or the newest that verifies (None:
    checkpointing off or none written). ConfigError, one line, when the one named cannot be used or none verifies."""
    if resume_from is not None:
        if manager is None:
            raise ConfigError(
                [f"--resume-from: {resume_from!r} given, but checkpointing.enabled is false; set it to true to resume"]
            )
        try:
            return manager.chosen(resume_from)
        except CheckpointError as error:
            raise ConfigError([f"--resume-from: {error}"]) from None
    if manager is None:
        return None
    try:
        return manager.latest()
    except CheckpointDamagedError as error:
        raise ConfigError([f"checkpointing: {error}"]) from None


def check_resume(config: RunConfig, run_dir: Path, resume_from: str | None = None) -> ResumePlan:
    """Refuse (ConfigError, one line per key) a config that breaks the resumed checkpoint's run; reads files only.
    `resume_from` names the checkpoint by hand (`step_N` or a checkpoint directory)."""
    manager = checkpoint_manager(config, run_dir)
    checkpoint = find_resume_checkpoint(manager, resume_from)
    if checkpoint is None:
        return ResumePlan(None, 0, [], manager)
    step = load_run_state(checkpoint).step
    errors: list[str] = []
    if config.ppo.max_num_steps < step:
        errors.append(
            f"ppo.max_num_steps: {config.ppo.max_num_steps} is below the checkpoint's step {step} ({checkpoint}); "
            "raise it or start a new run directory"
        )
    reference = next((p for p in (checkpoint / CONFIG_FILE, run_dir / CONFIG_FILE) if p.is_file()), None)
    changes: list[ConfigChange] = []
    if reference is not None:
        old, new = _read_tree(reference), _config_tree(config)
        errors.extend(refused_changes(old, new))
        changes = config_changes(old, new)
    if errors:
        raise ConfigError(errors)
    return ResumePlan(checkpoint, step, changes, manager, chosen_by_hand=resume_from is not None)


def prepare_checkpoints(plan: ResumePlan) -> None:
    """Print one note per newer checkpoint the resume passed over, and set aside the run's checkpoints after one
    chosen by hand (its own step too, when it lies elsewhere). Call it right before processes start."""
    if plan.manager is None or plan.checkpoint is None:
        return
    manager, checkpoint = plan.manager, plan.checkpoint
    for step, reason in sorted(manager.rejected.items(), reverse=True):
        if step > plan.step:
            print(f"note: step_{step} failed verification ({reason}); resuming from {checkpoint.name}", flush=True)
    if not plan.chosen_by_hand:
        return
    later = [
        record.path
        for record in manager.checkpoints()
        if record.step > plan.step or (record.step == plan.step and record.path.resolve() != checkpoint.resolve())
    ]
    if later:
        aside = manager.set_aside(later)
        print(
            f"note: resuming from {checkpoint} (--resume-from); the run's later checkpoints "
            f"{', '.join(path.name for path in later)} are set aside in {aside}",
            flush=True,
        )


def history_entries(run_dir: Path) -> list[Path]:
    """The run's config history, oldest first."""
    directory = run_dir / HISTORY_DIR
    if not directory.is_dir():
        return []
    numbered = [
        (int(match.group(1)), path) for path in directory.iterdir() if (match := _HISTORY_ENTRY.fullmatch(path.name))
    ]
    return [path for _, path in sorted(numbered)]


def record_config(config: RunConfig, run_dir: Path, plan: ResumePlan) -> Path | None:
    """Write this attempt's config where it belongs (see the module docstring) and print the `note:` line of a
    resume with changed keys. Call it after every check, right before processes start. Returns the file written."""
    text = dump_config(config)
    start_config = run_dir / CONFIG_FILE
    written: Path | None = None
    if plan.checkpoint is None or not start_config.is_file():
        # A fresh start (nothing to resume: the run begins again at step 0), or a first record in this directory.
        start_config.write_text(text)
        written = start_config
    else:
        entries = history_entries(run_dir)
        last_recorded = entries[-1] if entries else start_config
        if _read_tree(last_recorded) != _config_tree(config):
            written = run_dir / HISTORY_DIR / f"{len(entries) + 1:02d}_step{plan.step}.yaml"
            written.parent.mkdir(exist_ok=True)
            written.write_text(text)
    if plan.changes:
        listed = ", ".join(f"{change.key} {shown(change.old)} -> {shown(change.new)}" for change in plan.changes)
        where = f"; recorded in {written}" if written is not None else ""
        print(
            f"note: resuming from {plan.checkpoint} (step {plan.step}) with changed config keys: {listed}{where}",
            flush=True,
        )
    return written
