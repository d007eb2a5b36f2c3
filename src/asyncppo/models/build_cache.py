"""Build-once directories: a model built into a temporary sibling and renamed into place when complete.

Used by `tiny.ensure_tiny` and the demo policies (`asyncppo.demo`); a crash never leaves a half-written
model at the final path, and two processes racing on the same build keep whichever finished first.
"""

import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path


def build_once(final: Path, build: Callable[[Path], object], announce: str | None = None) -> Path:
    """`final` if it exists, else `build(staging)` into a temporary sibling renamed to `final`.

    `announce` names a build slow enough to need a word: a line before it starts and one with its time after
    (nothing is printed when `final` exists).
    """
    if final.is_dir():
        return final
    started = time.perf_counter()
    if announce is not None:
        print(f"building {announce}, once; cached in {final.parent} ...", flush=True)
    final.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{final.name}-building-", dir=final.parent))
    try:
        build(staging)
        try:
            staging.rename(final)
        except OSError:
            # Another process finished the same build first; its copy is built the same way, keep it.
            if not final.is_dir():
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    if announce is not None:
        print(f"built in {time.perf_counter() - started:.0f} s: {final}", flush=True)
    return final
