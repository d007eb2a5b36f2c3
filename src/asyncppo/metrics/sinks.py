"""Metric sink protocols and the local sinks: JSONL (always on; the run's record) and TensorBoard.

The driver builds the sinks and hands them to `MetricsLogger`, which calls `log(step, metrics)` once per step.
Keys are namespaced (`train/`, `critic/`, `mismatch/`, `async/`, `timing/`); values are floats.
"""

import json
import math
import numbers
import os
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import torch

_NON_FINITE_TO_TEXT = {math.inf: "inf", -math.inf: "-inf"}
_TEXT_TO_NON_FINITE = {"nan": math.nan, "inf": math.inf, "-inf": -math.inf}


@runtime_checkable
class MetricsSink(Protocol):
    """Receives one step's metrics at a time; `close` flushes and releases what the sink holds."""

    def log(self, step: int, metrics: Mapping[str, float]) -> None: ...

    def close(self) -> None: ...


@runtime_checkable
class ImageSink(MetricsSink, Protocol):
    """A sink that can also store an image file (the mismatch plot) under a key."""

    def log_image(self, step: int, key: str, path: str | os.PathLike[str]) -> None: ...


def metric_floats(metrics: Mapping[str, Any]) -> dict[str, float]:
    """The metrics as Python floats (ints, bools, numpy scalars, 1-element tensors too); ValueError names a bad key."""
    floats = {}
    for key, value in metrics.items():
        if isinstance(value, torch.Tensor) and value.numel() == 1:
            value = value.item()
        if not isinstance(value, numbers.Real):
            raise ValueError(f"metric {key!r} must be a number, got {type(value).__name__}: {value!r}")
        floats[key] = float(value)
    return floats


class JsonlSink:
    """One JSON object per line: {"step": N, "<key>": value, ...}, flushed every line (a crash loses nothing).

    NaN and infinities are written as the strings "nan", "inf" and "-inf" (JSON has no such numbers, and null
    would hide which one it was); `read_metrics_jsonl` turns them back into floats. The file is appended to.
    On resume from step N, pass `truncate_after_step=N`: records of later steps (logged by the crashed run and
    about to be logged again) are dropped first, so every step appears once.
    """

    def __init__(self, path: str | os.PathLike[str], *, truncate_after_step: int | None = None) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if truncate_after_step is not None and self.path.exists():
            _drop_records_after(self.path, truncate_after_step)
        needs_newline = self.path.exists() and self.path.stat().st_size > 0 and not _ends_with_newline(self.path)
        self._file = open(self.path, "a")  # noqa: SIM115  # held open for the run; closed by close()
        if needs_newline:  # a crash cut the last line short; start ours on a fresh line
            self._file.write("\n")

    def log(self, step: int, metrics: Mapping[str, float]) -> None:
        if "step" in metrics:
            raise ValueError("'step' is reserved in the JSONL record; rename the metric")
        record: dict[str, object] = {"step": step}
        for key, value in metric_floats(metrics).items():
            record[key] = value if math.isfinite(value) else _encode_non_finite(value)
        self._file.write(json.dumps(record, allow_nan=False) + "\n")
        self._file.flush()

    def close(self) -> None:
        self._file.close()


def _ends_with_newline(path: Path) -> bool:
    with open(path, "rb") as handle:
        handle.seek(-1, os.SEEK_END)
        return handle.read(1) == b"\n"


def _drop_records_after(path: Path, step: int) -> None:
    kept = [record for record in read_metrics_jsonl(path) if record["step"] <= step]
    temporary = path.with_name(f".{path.name}.tmp")
    with open(temporary, "w") as handle:
        for record in kept:
            encoded = {
                key: value if not isinstance(value, float) or math.isfinite(value) else _encode_non_finite(value)
                for key, value in record.items()
            }
            handle.write(json.dumps(encoded, allow_nan=False) + "\n")
    os.replace(temporary, path)


def _encode_non_finite(value: float) -> str:
    return "nan" if math.isnan(value) else _NON_FINITE_TO_TEXT[value]


def read_metrics_jsonl(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """The records of a JSONL metrics file in file order, with "nan"/"inf"/"-inf" turned back into floats.

    A last line cut short by a crash is skipped with a warning; a bad line anywhere else is a ValueError.
    """
    lines = Path(path).read_text().splitlines()
    records = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            raw = json.loads(line)
        except json.JSONDecodeError as error:
            if number == len(lines):
                warnings.warn(f"{path}:{number}: skipping a truncated last line: {line[:80]!r}", stacklevel=2)
                continue
            raise ValueError(f"{path}:{number}: not a JSON object: {line[:80]!r}") from error
        records.append(
            {
                key: _TEXT_TO_NON_FINITE.get(value, value) if isinstance(value, str) else value
                for key, value in raw.items()
            }
        )
    return records


class TensorBoardSink:
    """Scalars (and images) through torch's SummaryWriter, flushed every step."""

    def __init__(self, log_dir: str | os.PathLike[str]) -> None:
        # Imported here: tensorboard is slow to import and only needed when this sink is on.
        from torch.utils.tensorboard import SummaryWriter

        self._writer = SummaryWriter(log_dir=str(log_dir))

    def log(self, step: int, metrics: Mapping[str, float]) -> None:
        for key, value in metric_floats(metrics).items():
            self._writer.add_scalar(key, value, global_step=step)
        self._writer.flush()

    def log_image(self, step: int, key: str, path: str | os.PathLike[str]) -> None:
        import numpy
        from PIL import Image  # matplotlib's own dependency

        with Image.open(path) as image:
            pixels = numpy.asarray(image.convert("RGB"))
        self._writer.add_image(key, pixels, global_step=step, dataformats="HWC")
        self._writer.flush()

    def close(self) -> None:
        self._writer.close()
