"""What a run saves after a step and restores on start: `step_N/` of the checkpoint directory.

    step_N/  policy/ (once it has trained), value/     weights, optimizer, scheduler (the worker groups write them)
             batch_source.pt                           data position; async: buffer and collector
             accounting.json                           where every prompt drawn is (trained, dropped, buffered, ...)
             rng.pt, run_state.json (step, epoch, prompts drawn), config.yaml
             manifest.json, training_info.json         every file's size and hash; the completion marker

`checkpoint/manager.py` makes each write atomic (a directory without training_info.json is not a checkpoint),
verifies a checkpoint against its manifest before a resume trusts it, and keeps the best `keep_top_k`. Beyond the
manifest, `books_disagreement` cross-checks the run state with the books saved beside it (the state a resume
really restores), so an edited run_state.json is refused even with a manifest rewritten to match:

    run_state.json   step S      == the directory's step_N == training_info.json's step
                     S x prompts per step == prompts trained in batch_source.pt's ledger == in accounting.json
                     epoch, num_consumed_prompts == the prompt stream's position in batch_source.pt

Built by `trainer/build.py`; the loop calls `restore` once and `save` on schedule.
"""

import dataclasses
import json
import logging
import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import yaml

from asyncppo.checkpoint import (
    RUN_STATE_FILE,
    TRAINING_INFO_FILE,
    CheckpointDamagedError,
    CheckpointManager,
    RunState,
    load_run_state,
    load_state,
    restore_rng_state,
    save_rng_state,
    save_run_state,
    save_state,
)
from asyncppo.config import RunConfig, dump_config
from asyncppo.pipeline.sources import BatchSource
from asyncppo.workers.groups import PolicyGroup, ValueGroup

log = logging.getLogger(__name__)
T = TypeVar("T")
POLICY_DIR, VALUE_DIR, SOURCE_STATE_FILE, RNG_STATE_FILE, CONFIG_FILE, ACCOUNTING_FILE = (
    "policy",
    "value",
    "batch_source.pt",
    "rng.pt",
    "config.yaml",
    "accounting.json",
)


_STEP_DIR = re.compile(r"step_(\d+)")


def checkpoint_manager(config: RunConfig, run_dir: Path) -> CheckpointManager | None:
    """The run's checkpoint directory (checkpointing.checkpoint_dir, default RUN_DIR/checkpoints), verifying what it
    resumes with `books_disagreement`; None when checkpointing is off."""
    section = config.checkpointing
    if not section.enabled:
        return None
    directory = Path(section.checkpoint_dir or run_dir / "checkpoints")
    num_prompts_per_step = config.ppo.num_prompts_per_step
    return CheckpointManager(
        directory,
        section.keep_top_k,
        section.metric_name,
        section.higher_is_better,
        cross_check=lambda checkpoint: books_disagreement(checkpoint, num_prompts_per_step),
    )


def prompt_position(source_state: dict[str, Any]) -> dict[str, Any]:
    """The prompt stream's state (epoch, num_prompts_consumed, ...) inside a batch source's state: a sync source
    holds it at the top, the async source in its collector's."""
    if "prompts" in source_state:
        return source_state["prompts"]
    return source_state["collector"]["prompts"]


def _trained_count(source_state: dict[str, Any]) -> int:
    """Prompts trained, by the ledger a resume restores: the sync source's own, or the async buffer's."""
    ledger = source_state["ledger"] if "ledger" in source_state else source_state["buffer"]["ledger"]
    return sum(int(end) - int(start) for start, end in ledger["trained"])


class _Unreadable(Exception):
    """A file of the books that cannot be read, or lacks what the cross-check reads; the message names it."""


def _read(name: str, read: Callable[[], T]) -> T:
    """`read()`, which reads the checkpoint's file `name`; _Unreadable naming the file when it cannot."""
    try:
        return read()
    except FileNotFoundError:
        raise _Unreadable(f"{name}: missing") from None
    # Whatever a damaged file makes a reader raise (torch.load alone raises half a dozen kinds, and a file of the
    # wrong shape a KeyError or TypeError): a checkpoint whose books cannot be read is refused like a wrong hash.
    except Exception as error:
        raise _Unreadable(f"{name}: unreadable ({type(error).__name__}: {error})") from error


def books_disagreement(checkpoint: Path, default_prompts_per_step: int) -> str | None:
    """None when the run state of `checkpoint` agrees with its books (see the module docstring); else the first
    disagreement, as `<file>: <what is wrong>`. The prompts per step are the checkpoint's own config's
    (`default_prompts_per_step` for a checkpoint without one)."""
    try:
        return _first_disagreement(checkpoint, default_prompts_per_step)
    except _Unreadable as error:
        return str(error)


def _first_disagreement(checkpoint: Path, default_prompts_per_step: int) -> str | None:
    state = _read(RUN_STATE_FILE, lambda: load_run_state(checkpoint))
    step = state.step
    counts = {"step": step, "epoch": state.epoch, "num_consumed_prompts": state.num_consumed_prompts}
    for key, value in counts.items():
        if type(value) is not int or value < 0:
            return f"{RUN_STATE_FILE}: {key} is {value!r}, not a count"
    named = _STEP_DIR.fullmatch(checkpoint.name)
    if named is not None and int(named.group(1)) != step:
        return f"{RUN_STATE_FILE}: step {step} in the directory {checkpoint.name}"
    marked = _read(TRAINING_INFO_FILE, lambda: json.loads((checkpoint / TRAINING_INFO_FILE).read_text())["step"])
    if marked != step:
        return f"{RUN_STATE_FILE}: step {step}, but {TRAINING_INFO_FILE} says step {marked!r}"
    per_step = _prompts_per_step(checkpoint, default_prompts_per_step)
    source_state = _read(SOURCE_STATE_FILE, lambda: load_state(checkpoint / SOURCE_STATE_FILE))
    trained = _read(SOURCE_STATE_FILE, lambda: _trained_count(source_state))
    if trained != step * per_step:
        return (
            f"{RUN_STATE_FILE}: step {step} x {per_step} prompts per step = {step * per_step} prompts trained, "
            f"but the books ({SOURCE_STATE_FILE}) hold {trained}"
        )
    reported = _read(ACCOUNTING_FILE, lambda: _reported_trained_count(checkpoint / ACCOUNTING_FILE))
    if reported != trained:
        return f"{ACCOUNTING_FILE}: {reported} prompts trained, but {SOURCE_STATE_FILE}'s ledger holds {trained}"
    stream = _read(SOURCE_STATE_FILE, lambda: prompt_position(source_state))
    position = _read(
        SOURCE_STATE_FILE, lambda: {"epoch": stream["epoch"], "num_consumed_prompts": stream["num_prompts_consumed"]}
    )
    for key, value in position.items():
        if counts[key] != value:
            return f"{RUN_STATE_FILE}: {key} {counts[key]}, but the prompt stream in {SOURCE_STATE_FILE} says {value!r}"
    return None


def _reported_trained_count(path: Path) -> int:
    return sum(int(end) - int(start) for start, end in json.loads(path.read_text())["trained"])


def _prompts_per_step(checkpoint: Path, default: int) -> int:
    """ppo.num_prompts_per_step of the checkpoint's own config (a resume may not change it; the config check that
    says so comes after this one)."""
    path = checkpoint / CONFIG_FILE
    if not path.is_file():
        return default
    return _read(CONFIG_FILE, lambda: int(yaml.safe_load(path.read_text())["ppo"]["num_prompts_per_step"]))


@dataclass
class RunCheckpoints:
    """Saves and restores the state a run needs to continue exactly where it was."""

    manager: CheckpointManager | None
    """None when checkpointing is off: nothing is saved, and a run starts fresh."""
    config: RunConfig
    policy: PolicyGroup
    value: ValueGroup | None
    source: BatchSource
    resume_from: Path | None
    """The verified checkpoint `restore` loads (the resume plan's, `trainer/resume.py`); None: a fresh start."""

    def latest(self) -> Path | None:
        """The checkpoint a rerun would resume from; None when there is none (or none that verifies)."""
        if self.manager is None:
            return None
        try:
            return self.manager.latest()
        except CheckpointDamagedError:
            return None

    def restore(self) -> int:
        """Resume from `resume_from`; returns the step to start from (0 for a fresh run, whose critic is
        warm-started from value.warm_start_path when set)."""
        checkpoint = self.resume_from
        if checkpoint is None:
            self._warm_start_critic()
            return 0
        state = load_run_state(checkpoint)
        if (checkpoint / POLICY_DIR).is_dir():
            self.policy.load(checkpoint / POLICY_DIR)
        else:
            log.warning(
                "checkpoint %s has no policy (still in critic warm-up): the policy starts from its base", checkpoint
            )
        if self.value is not None:
            self.value.load(checkpoint / VALUE_DIR)
        self.source.load_state_dict(load_state(checkpoint / SOURCE_STATE_FILE))
        restore_rng_state(load_state(checkpoint / RNG_STATE_FILE))
        print(f"resumed from {checkpoint} (step {state.step})", flush=True)
        return state.step

    def _warm_start_path(self) -> str | None:
        return self.config.value.warm_start_path if self.config.value is not None else None

    def _warm_start_critic(self) -> None:
        path = self._warm_start_path()
        if path is not None and self.value is not None:
            self.value.warm_start(path)
            print(f"critic warm-started from {path} (weights only, fresh optimizer)", flush=True)

    def save(self, step: int, metrics: dict[str, float], policy_has_trained: bool) -> Path | None:
        """Write checkpoint `step_<step>` (the state after `step` completed steps); None when checkpointing is off."""
        if self.manager is None:
            return None
        directory = self.manager.begin(step)
        if policy_has_trained:
            self.policy.save(directory / POLICY_DIR)
        if self.value is not None:
            self.value.save(directory / VALUE_DIR)
        # One snapshot: the books then describe exactly the state a resume starts from (the async collector runs on).
        snapshot = self.source.snapshot()
        source_state = snapshot.state
        save_state(directory / SOURCE_STATE_FILE, source_state)
        # The run's own books: every prompt drawn is trained, dropped with a reason, buffered or pending.
        (directory / ACCOUNTING_FILE).write_text(json.dumps(dataclasses.asdict(snapshot.accounting), indent=1))
        save_state(directory / RNG_STATE_FILE, save_rng_state())
        # Where the critic's first weights came from stays on record in every checkpoint of the run.
        warm_start = self._warm_start_path()
        prompts = prompt_position(source_state)  # async: the collector's stream, which draws ahead of training
        run_state = RunState(
            step=step,
            epoch=int(prompts["epoch"]),
            num_consumed_prompts=int(prompts["num_prompts_consumed"]),
            extra={"value_warm_start": warm_start} if warm_start else {},
        )
        save_run_state(directory, run_state)
        (directory / CONFIG_FILE).write_text(dump_config(self.config))
        ranking = {key.replace("/", ":", 1): value for key, value in metrics.items() if math.isfinite(value)}
        return self.manager.finalize(step, {**metrics, **ranking})
