"""The driver's parts of a checkpoint: plain-data state files, RNG state, run_state.json and the warm-start marker.

Called by the driver (and the workers for their optimizer/scheduler states) while a checkpoint is open, and on
resume. Nothing here unpickles arbitrary objects: state files are read with `torch.load(weights_only=True)`.
"""

import json
import os
import random
import sys
import warnings
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import torch

from asyncppo.checkpoint.manager import write_json_atomic

RUN_STATE_FILE = "run_state.json"
WARM_START_FILE = "warm_start_provenance.txt"
# Exact types: numpy.float64 subclasses float but weights_only loading refuses it.
_PLAIN_SCALARS = (bool, int, float, str, type(None), torch.dtype, torch.device, torch.Size)


def _check_plain(obj: object, key_path: str) -> None:
    """Raise TypeError naming the key path of the first value that weights_only loading would refuse."""
    kind = type(obj)
    if isinstance(obj, torch.Tensor) or kind in _PLAIN_SCALARS:
        return
    # Exact container types too: weights_only loading rebuilds dict, OrderedDict, list and tuple, no subclasses.
    # (The casts: isinstance leaves the items' types unknown; they are checked as plain objects.)
    if isinstance(obj, dict) and kind in (dict, OrderedDict):
        for key, value in cast(dict[object, object], obj).items():
            if not isinstance(key, str | int):
                raise TypeError(f"{key_path}: dict key {key!r} is a {type(key).__name__}, not str or int")
            _check_plain(value, f"{key_path}.{key}")
        return
    if isinstance(obj, list | tuple) and kind in (list, tuple):
        for index, value in enumerate(cast(list[object] | tuple[object, ...], obj)):
            _check_plain(value, f"{key_path}[{index}]")
        return
    raise TypeError(
        f"{key_path}: {kind.__module__}.{kind.__qualname__} cannot go into a state file "
        "(tensors, dicts, lists, tuples, numbers, strings and None only); convert it with state_dict() first"
    )


def save_state(path: str | os.PathLike[str], obj: object) -> None:
    """torch.save `obj` after checking it holds only plain data, so that `load_state` can read it back.

    Checking at save time turns a resume-time surprise (a file that weights_only refuses) into an error now.
    """
    _check_plain(obj, "state")
    torch.save(obj, path)


def load_state(path: str | os.PathLike[str]) -> Any:
    """Load a state file onto the CPU without unpickling arbitrary objects (pickle.UnpicklingError otherwise)."""
    return torch.load(path, map_location="cpu", weights_only=True)


def save_rng_state() -> dict[str, Any]:
    """Every RNG this process may draw from, as plain data for `save_state`.

    python `random`; numpy's global RNG only when numpy is already imported (importing it here would be a side
    effect); torch CPU; torch CUDA only when CUDA is initialised, because querying it would otherwise create a
    CUDA context (GPU memory) in a driver that never touched the GPU and so never drew from its RNG.
    """
    version, internal_state, gauss_next = random.getstate()
    state: dict[str, Any] = {
        "python": {"version": version, "state": list(internal_state), "gauss_next": gauss_next},
        "torch_cpu": torch.get_rng_state(),
    }
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        name, keys, position, has_gauss, cached_gaussian = numpy.random.get_state(legacy=True)
        state["numpy"] = {
            "bit_generator": str(name),
            # torch's stub leaves from_numpy's parameter unannotated (`def from_numpy(ndarray) -> Tensor`).
            "keys": torch.from_numpy(keys.astype("int64")),  # pyright: ignore[reportUnknownMemberType]
            "position": int(position),
            "has_gauss": int(has_gauss),
            "cached_gaussian": float(cached_gaussian),
        }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["torch_cuda"] = list(torch.cuda.get_rng_state_all())
    return state


def restore_rng_state(state: Mapping[str, Any]) -> None:
    """Put back what `save_rng_state` captured; draws afterwards repeat the draws that followed the save."""
    python = state["python"]
    random.setstate((python["version"], tuple(python["state"]), python["gauss_next"]))
    torch.set_rng_state(state["torch_cpu"])
    if "numpy" in state:
        import numpy  # the saving process used numpy, so this one restores it (numpy comes with torch)

        saved = state["numpy"]
        keys = saved["keys"].numpy().astype(numpy.uint32)
        numpy.random.set_state(
            (saved["bit_generator"], keys, saved["position"], saved["has_gauss"], saved["cached_gaussian"])
        )
    if "torch_cuda" in state and torch.cuda.is_available():
        saved_cuda = state["torch_cuda"]
        num_devices = torch.cuda.device_count()
        if len(saved_cuda) != num_devices:
            warnings.warn(
                f"RNG state was saved with {len(saved_cuda)} CUDA devices and this process sees {num_devices}; "
                "restoring the first min(saved, visible) devices only",
                stacklevel=2,
            )
        for device, device_state in enumerate(saved_cuda[:num_devices]):
            torch.cuda.set_rng_state(device_state, device)


@dataclass(frozen=True)
class RunState:
    """The driver's loop position: the step just completed, and where the prompt stream is: `epoch`, the (0-based)
    epoch of the newest prompts drawn, and `num_consumed_prompts`, the prompts drawn over all epochs (async: the
    collector's stream, which draws ahead of the steps trained). A resume cross-checks them with the books."""

    step: int
    epoch: int
    num_consumed_prompts: int
    extra: dict[str, Any] = field(default_factory=dict[str, Any])
    """Anything else the driver wants back on resume (JSON-serialisable)."""


def save_run_state(checkpoint_path: str | os.PathLike[str], run_state: RunState) -> Path:
    """Write `run_state.json` into the checkpoint directory (atomically); returns its path."""
    core = {"step": run_state.step, "epoch": run_state.epoch, "num_consumed_prompts": run_state.num_consumed_prompts}
    clashes = sorted(core.keys() & run_state.extra.keys())
    if clashes:
        raise ValueError(f"run state extra keys {clashes} clash with the fixed fields {sorted(core)}")
    path = Path(checkpoint_path) / RUN_STATE_FILE
    try:
        write_json_atomic(path, {**core, **run_state.extra})
    except (TypeError, ValueError) as error:
        raise ValueError(f"run state extra must be finite JSON data: {error}") from error
    return path


def load_run_state(checkpoint_path: str | os.PathLike[str]) -> RunState:
    """Read `run_state.json` back; keys other than the fixed fields come back in `extra`."""
    path = Path(checkpoint_path) / RUN_STATE_FILE
    payload = json.loads(path.read_text())
    missing = [key for key in ("step", "epoch", "num_consumed_prompts") if key not in payload]
    if missing:
        raise ValueError(f"{path}: missing keys {missing}")
    step, epoch, consumed = payload.pop("step"), payload.pop("epoch"), payload.pop("num_consumed_prompts")
    return RunState(step=step, epoch=epoch, num_consumed_prompts=consumed, extra=payload)


def mark_warm_start(checkpoint_path: str | os.PathLike[str], source: str) -> Path:
    """Mark a checkpoint as a critic warm-start seed made from `source` (free text, e.g. the pretraining run).

    The value worker that finds the marker loads the critic weights with a FRESH optimizer and LR schedule.
    """
    path = Path(checkpoint_path) / WARM_START_FILE
    path.write_text(source.rstrip("\n") + "\n")
    return path


def is_warm_start(checkpoint_path: str | os.PathLike[str]) -> bool:
    """Whether `mark_warm_start` marked this checkpoint directory."""
    return (Path(checkpoint_path) / WARM_START_FILE).is_file()


def warm_start_source(checkpoint_path: str | os.PathLike[str]) -> str | None:
    """The `source` given to `mark_warm_start`, or None for an ordinary checkpoint."""
    path = Path(checkpoint_path) / WARM_START_FILE
    return path.read_text().rstrip("\n") if path.is_file() else None
