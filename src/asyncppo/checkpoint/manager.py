"""CheckpointManager: the step-directory write protocol, keep-top-k pruning and finding the latest complete step.

The driver calls `begin(step)`, has every component write its part into the returned `tmp_step_N/` (the policy
workers `policy/`, the value workers `value/`, the driver the rest) and then calls `finalize(step, metrics)`:

    begin: tmp_step_N/ --components write--> finalize: training_info.json, fsync --rename--> step_N/ --> prune

A directory counts as a checkpoint only when it is named `step_N` AND holds `training_info.json`; finalize writes
that file last and renames atomically, so a crash at any point leaves the previous checkpoints usable. Before it,
finalize writes the manifest (`manifest.py`: every file's size and SHA-256). `verify` checks a checkpoint against
it and then with the owner's `cross_check` (a run compares its run state with its books, `trainer/run_checkpoints.py`),
hashing each checkpoint once per manager; `latest()` returns the newest checkpoint that verifies, noting each newer
one that does not (`rejected`), and raises CheckpointDamagedError when checkpoints exist but none verifies;
`chosen(...)` finds and verifies one named by hand. A run never resumes from damaged state.
"""

import json
import math
import os
import re
import shutil
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from asyncppo.checkpoint.manifest import damage_in, write_manifest

TRAINING_INFO_FILE = "training_info.json"
_STEP_DIR = re.compile(r"step_(\d+)")
_METRIC_PREFIXES = ("val:", "train:")


class CheckpointError(RuntimeError):
    """A checkpoint cannot be resumed from; the message is one line naming it and why."""


class CheckpointDamagedError(CheckpointError):
    """Checkpoints exist but none verifies (or the one chosen by hand does not); one line naming each and its first
    problem."""


CrossCheck = Callable[[Path], str | None]
"""A checkpoint whose files match its manifest -> None when its contents agree with each other, else the first
disagreement as `<file>: <what is wrong>`."""


@dataclass(frozen=True)
class CheckpointRecord:
    """A complete checkpoint on disk: its step, directory and ranking value (None when absent or non-finite)."""

    step: int
    path: Path
    metric_value: float | None


def fsync_tree(root: Path) -> None:
    """fsync every file and directory under `root` (and root itself), so a rename publishes durable contents."""
    for directory, _, files in os.walk(root):
        for name in files:
            with open(os.path.join(directory, name), "rb") as handle:
                os.fsync(handle.fileno())
        fsync_directory(Path(directory))


def fsync_directory(path: Path) -> None:
    """fsync a directory entry list (makes renames and new files inside it durable on POSIX)."""
    descriptor = os.open(path, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


def write_json_atomic(path: Path, payload: Mapping[str, object]) -> None:
    """Write JSON to a sibling temp file, fsync it and rename it over `path` (readers never see half a file).

    NaN and infinities are refused (ValueError): they are not JSON and other tools would choke on them.
    """
    text = json.dumps(payload, indent=2, sort_keys=True, allow_nan=False)
    temporary = path.with_name(f".{path.name}.tmp")
    with open(temporary, "w") as handle:
        handle.write(text + "\n")
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(temporary, path)


class CheckpointManager:
    """Writes `step_N` directories under `checkpoint_dir` and keeps at most `keep_top_k` of them (+ the latest).

    Ranking (`metric_name` = "val:<key>" or "train:<key>", looked up in the metrics passed to `finalize`):
    higher or lower is better per `higher_is_better`; ties go to the newer step. A checkpoint whose metric is
    absent (a step without validation) or non-finite ranks below every finite value, so it is pruned first:
    keeping unranked checkpoints instead would let disk use grow without bound whenever saving is more
    frequent than validating. Without a metric_name the newest `keep_top_k` are kept. The newest checkpoint
    and the one just finalized are never pruned, so up to keep_top_k + 1 may remain. keep_top_k None keeps all.
    """

    def __init__(
        self,
        checkpoint_dir: str | os.PathLike[str],
        keep_top_k: int | None,
        metric_name: str | None,
        higher_is_better: bool,
        cross_check: CrossCheck | None = None,
    ) -> None:
        if keep_top_k is not None and keep_top_k < 1:
            raise ValueError(f"keep_top_k must be None or >= 1, got {keep_top_k!r}")
        if metric_name is not None and not (
            metric_name.startswith(_METRIC_PREFIXES) and len(metric_name.partition(":")[2]) > 0
        ):
            raise ValueError(f"metric_name must look like 'val:<key>' or 'train:<key>', got {metric_name!r}")
        self.checkpoint_dir = Path(checkpoint_dir)
        self.keep_top_k = keep_top_k
        self.metric_name = metric_name
        self.higher_is_better = higher_is_better
        self.cross_check = cross_check
        # The directory is made by the first `begin`: a run refused before it saves leaves no trace.
        self._recover_interrupted_overwrites()
        self._verdicts: dict[Path, str | None] = {}
        """What `verify` found in each checkpoint it looked at (None: it verifies)."""
        self.rejected: dict[int, str] = {}
        """Checkpoints `latest()` passed over, by step: the first problem found in each."""

    def step_path(self, step: int) -> Path:
        return self.checkpoint_dir / f"step_{step}"

    def tmp_path(self, step: int) -> Path:
        return self.checkpoint_dir / f"tmp_step_{step}"

    def begin(self, step: int) -> Path:
        """Create an empty `tmp_step_{step}/` (a stale one from a crashed save is removed) and return it."""
        if step < 0:
            raise ValueError(f"checkpoint step must be >= 0, got {step}")
        self.checkpoint_dir.mkdir(parents=True, exist_ok=True)
        tmp = self.tmp_path(step)
        if tmp.exists():
            shutil.rmtree(tmp)
        tmp.mkdir()
        return tmp

    def finalize(self, step: int, metrics: Mapping[str, float]) -> Path:
        """Publish `tmp_step_{step}` as `step_{step}` (replacing an existing one), prune, and return the step path.

        training_info.json holds the step, a UTC timestamp and the ranking metric under its full key (null when
        non-finite; absent when `metrics` lacks it). The key is looked up as given ("val:acc") and in the
        namespaced form of the metric keys ("val/acc").
        """
        tmp = self.tmp_path(step)
        if not tmp.is_dir():
            raise ValueError(f"finalize({step}) without begin({step}): {tmp} does not exist")
        info: dict[str, object] = {"step": step, "timestamp": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
        value = self._metric_value(metrics)
        if self.metric_name is not None and value is not None:
            info[self.metric_name] = float(value) if math.isfinite(value) else None
        # Components' files first, then their manifest, training_info.json last: it marks the directory complete.
        write_manifest(tmp)
        fsync_tree(tmp)
        write_json_atomic(tmp / TRAINING_INFO_FILE, info)
        fsync_directory(tmp)
        final = self.step_path(step)
        if final.exists():
            aside = self.checkpoint_dir / f"old_step_{step}"
            if aside.exists():
                shutil.rmtree(aside)
            os.rename(final, aside)
            os.rename(tmp, final)
            fsync_directory(self.checkpoint_dir)
            shutil.rmtree(aside)
        else:
            os.rename(tmp, final)
            fsync_directory(self.checkpoint_dir)
        self._verdicts[final] = None  # just written and hashed by this process
        self.prune(protect_step=step)
        return final

    def checkpoints(self) -> list[CheckpointRecord]:
        """Every complete checkpoint, oldest step first (tmp_step_*, old_step_* and unmarked dirs are ignored)."""
        records: list[CheckpointRecord] = []
        if not self.checkpoint_dir.is_dir():
            return records
        for entry in self.checkpoint_dir.iterdir():
            match = _STEP_DIR.fullmatch(entry.name)
            info_path = entry / TRAINING_INFO_FILE
            if match is None or not entry.is_dir() or not info_path.is_file():
                continue
            try:
                info = json.loads(info_path.read_text())
            except ValueError as error:  # a damaged marker: not a checkpoint to rank or resume from
                self.rejected[int(match.group(1))] = f"{TRAINING_INFO_FILE}: unreadable ({error})"
                continue
            value = info.get(self.metric_name) if self.metric_name is not None else None
            metric_value = float(value) if isinstance(value, int | float) and math.isfinite(value) else None
            records.append(CheckpointRecord(int(match.group(1)), entry, metric_value))
        return sorted(records, key=lambda record: record.step)

    def verify(self, checkpoint: Path) -> str | None:
        """None when `checkpoint`'s files match its manifest and the cross-check finds them consistent; else the first
        problem, as `<file>: <what is wrong>`. Each checkpoint is checked once per manager (what it wrote is
        trusted): a resume hashes its checkpoint once, however often it is asked."""
        if checkpoint not in self._verdicts:
            problem = damage_in(checkpoint)
            if problem is None and self.cross_check is not None:
                problem = self.cross_check(checkpoint)
            self._verdicts[checkpoint] = problem
        return self._verdicts[checkpoint]

    def latest(self) -> Path | None:
        """The verified checkpoint with the highest step number, or None when there is none; newer ones that fail
        verification are noted in `rejected`. CheckpointDamagedError when checkpoints exist and none verifies."""
        records = self.checkpoints()
        for record in reversed(records):
            problem = self.verify(record.path)
            if problem is None:
                return record.path
            self.rejected[record.step] = problem
        if self.rejected:
            found = "; ".join(f"step_{step}: {reason}" for step, reason in sorted(self.rejected.items()))
            raise CheckpointDamagedError(
                f"no checkpoint in {self.checkpoint_dir} verifies ({found}); move the directory aside to start "
                "afresh, or resume from a good copy with --resume-from"
            )
        return None

    def chosen(self, choice: str) -> Path:
        """The checkpoint named by hand: `step_N` (in this directory) or a checkpoint directory's path, verified.
        CheckpointError (one line naming it) when it is not a complete checkpoint, CheckpointDamagedError when it
        fails verification."""
        named = _STEP_DIR.fullmatch(choice)
        path = self.step_path(int(named.group(1))) if named is not None else Path(choice).expanduser().absolute()
        if path.parent.resolve() == self.checkpoint_dir.resolve():  # one of ours, however spelled: one name for it
            path = self.checkpoint_dir / path.name
        if not path.is_dir():
            listed = ", ".join(record.path.name for record in self.checkpoints()) or "none"
            where = f"{path} is not a directory" if path.exists() else f"no directory {path}"
            raise CheckpointError(f"{choice!r}: {where} (checkpoints in {self.checkpoint_dir}: {listed})")
        if not (path / TRAINING_INFO_FILE).is_file():
            raise CheckpointError(
                f"{path} is not a complete checkpoint (no {TRAINING_INFO_FILE}: a save that never finished, or "
                "not a checkpoint directory)"
            )
        problem = self.verify(path)
        if problem is not None:
            raise CheckpointDamagedError(f"{path} failed verification ({problem})")
        return path

    def set_aside(self, checkpoints: list[Path]) -> Path:
        """Move `checkpoints` (of this directory) into its `set_aside/` directory, where neither a resume nor
        pruning sees them (nothing is deleted); returns that directory."""
        aside = self.checkpoint_dir / "set_aside"
        aside.mkdir(exist_ok=True)
        for path in checkpoints:
            target, copy = aside / path.name, 1
            while target.exists():  # set aside before, by an earlier resume by hand
                copy += 1
                target = aside / f"{path.name}.{copy}"
            os.rename(path, target)
            self._verdicts.pop(path, None)
        fsync_directory(self.checkpoint_dir)
        return aside

    def prune(self, protect_step: int | None = None) -> list[Path]:
        """Delete checkpoints beyond keep_top_k (see the class docstring for the rule); returns what was deleted."""
        records = self.checkpoints()
        if self.keep_top_k is None or len(records) <= self.keep_top_k:
            return []
        sign = 1.0 if self.higher_is_better else -1.0

        # Best first: ranked before unranked, then by metric, then newer before older (ties -> newer wins).
        def rank(record: CheckpointRecord) -> tuple[bool, float, int]:
            if self.metric_name is None or record.metric_value is None:
                return (False, 0.0, record.step)
            return (True, sign * record.metric_value, record.step)

        ranked = sorted(records, key=rank, reverse=True)
        protected = {records[-1].step, protect_step}
        deleted: list[Path] = []
        for record in ranked[self.keep_top_k :]:
            if record.step not in protected:
                shutil.rmtree(record.path)
                deleted.append(record.path)
        return deleted

    def _metric_value(self, metrics: Mapping[str, float]) -> float | None:
        if self.metric_name is None:
            return None
        prefix, _, key = self.metric_name.partition(":")
        for candidate in (self.metric_name, f"{prefix}/{key}"):
            if candidate in metrics:
                return float(metrics[candidate])
        return None

    def _recover_interrupted_overwrites(self) -> None:
        # A crash inside finalize's overwrite can leave `old_step_N` with `step_N` missing. The new copy wins when
        # `tmp_step_N` is complete (training_info.json is written last); otherwise the old copy is put back.
        for aside in self.checkpoint_dir.glob("old_step_*"):
            step = aside.name.removeprefix("old_step_")
            final, tmp = self.checkpoint_dir / f"step_{step}", self.checkpoint_dir / f"tmp_step_{step}"
            if not final.exists():
                complete_tmp = (tmp / TRAINING_INFO_FILE).is_file()
                os.rename(tmp if complete_tmp else aside, final)
                fsync_directory(self.checkpoint_dir)
            if aside.exists():
                shutil.rmtree(aside)
