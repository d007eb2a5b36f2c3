"""Build-once directories: a model built into a temporary sibling and renamed into place when complete.

Used by `tiny.ensure_tiny` and the demo policies (`asyncppo.demo`); a crash never leaves a half-written
model at the final path. Processes that need the same build at once (parallel test workers, two runs started
together) take turns on a lock file beside it: the first builds, the others wait and then find it built,
instead of each spending the build's minutes on the same result.
"""

import contextlib
import fcntl
import shutil
import tempfile
import time
from collections.abc import Callable, Generator
from pathlib import Path


def build_once(final: Path, build: Callable[[Path], object], announce: str | None = None) -> Path:
    """`final` if it exists, else `build(staging)` into a temporary sibling renamed to `final`.

    `announce` names a build slow enough to need a word: a line before it starts and one with its time after
    (nothing is printed when `final` exists).
    """
    if final.is_dir():
        return final
    final.parent.mkdir(parents=True, exist_ok=True)
    with _exclusive(final.parent / f".{final.name}.lock"):
        if final.is_dir():  # another process built it while this one waited for the lock
            return final
        return _build(final, build, announce)


@contextlib.contextmanager
def _exclusive(lock_path: Path) -> Generator[None]:
    """Hold an exclusive advisory lock on `lock_path` for the block (released by the OS if the process dies)."""
    with lock_path.open("a") as lock_file:
        fcntl.flock(lock_file, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock_file, fcntl.LOCK_UN)


def _build(final: Path, build: Callable[[Path], object], announce: str | None) -> Path:
    started = time.perf_counter()
    if announce is not None:
        print(f"building {announce}, once; cached in {final.parent} ...", flush=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{final.name}-building-", dir=final.parent))
    try:
        build(staging)
        try:
            staging.rename(final)
        except OSError:
            # A process that does not take the lock (an older version) finished the same build first: keep its copy.
            if not final.is_dir():
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    if announce is not None:
        print(f"built in {time.perf_counter() - started:.0f} s: {final}", flush=True)
    return final
