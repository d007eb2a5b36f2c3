"""A checkpoint's manifest: every file's size and SHA-256, written inside the temporary directory before it is
published and checked before a resume trusts the checkpoint.

    finalize: components' files --write_manifest--> manifest.json --> training_info.json --> rename to step_N
    resume:   step_N --damage_in--> None (intact) | "policy/model.safetensors: hash mismatch" (the first problem)

Flipped bytes of the same file size, a truncated or deleted file, and an edited number in a JSON file are all
caught; only training_info.json (written after the manifest, read for ranking) is outside it.
"""

import hashlib
import json
from pathlib import Path
from typing import Any, cast

MANIFEST_FILE = "manifest.json"
UNLISTED = frozenset({MANIFEST_FILE, "training_info.json"})
"""Files a checkpoint holds outside its manifest: the manifest itself and the completion marker written after it."""


def _sha256(path: Path) -> str:
    with path.open("rb") as handle:
        return hashlib.file_digest(handle, "sha256").hexdigest()


def write_manifest(directory: Path) -> None:
    """Record the size and SHA-256 of every file under `directory` (but UNLISTED) in its manifest.json."""
    files = {
        path.relative_to(directory).as_posix(): {"size": path.stat().st_size, "sha256": _sha256(path)}
        for path in sorted(directory.rglob("*"))
        if path.is_file() and path.relative_to(directory).as_posix() not in UNLISTED
    }
    (directory / MANIFEST_FILE).write_text(json.dumps({"files": files}, indent=1, sort_keys=True) + "\n")


def damage_in(directory: Path) -> str | None:
    """None when every file of the manifest is there with its size and hash; else the first problem, as
    `<file>: <what is wrong>` (the manifest's own problems name manifest.json)."""
    try:
        manifest = json.loads((directory / MANIFEST_FILE).read_text())
        files = cast(dict[str, dict[str, Any]], manifest["files"])
        expected = {name: (int(entry["size"]), str(entry["sha256"])) for name, entry in files.items()}
    except FileNotFoundError:
        return f"{MANIFEST_FILE}: missing (a checkpoint written without one cannot be verified)"
    except (ValueError, KeyError, TypeError, AttributeError) as error:
        return f"{MANIFEST_FILE}: unreadable ({type(error).__name__}: {error})"
    for name, (size, digest) in sorted(expected.items()):
        path = directory / name
        if not path.is_file():
            return f"{name}: missing"
        if path.stat().st_size != size:
            return f"{name}: size {path.stat().st_size} bytes, the manifest says {size}"
        if _sha256(path) != digest:
            return f"{name}: hash mismatch"
    return None
