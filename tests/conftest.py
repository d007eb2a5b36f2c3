"""Fixtures shared by every test folder: one tiny model directory per session, one model cache shared by the
session's parallel workers, one local Ray cluster per session, one intra-op thread per test."""

import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from asyncppo.models.tiny import ensure_tiny

# A run that ends well keeps its worker processes for the next run of the same test process (workers/host_pool.py):
# each new process spends ~7 s importing before any work, and most of the suite's runs ask for the same devices.
# Child processes (a CLI run in a subprocess) inherit it; they start their own Ray and keep nothing.
os.environ.setdefault("ASYNCPPO_KEEP_WORKER_PROCESSES", "1")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Slow tests first in every pytest-xdist worker's share (a stable order within each kind).

    `--dist worksteal` hands worker k the k-th contiguous slice of the list and later lets an idle worker take the
    tail of another's queue. With every slow test at the head of the list, they all fell to the first worker, one
    after another, while the second ran quick tests; a long run started last left a worker idle at the end. So the
    slow tests are dealt out to the workers a file at a time, each worker's put at the head of its slice: the long
    end-to-end runs start on every worker at once, the quick tests fill the gaps and the end. Dealt, not cut into
    contiguous parts: neighbouring files are often the longest (the async demo's stop-and-resume run and the
    chaos harness's, about 120 s and 85 s), and a contiguous cut put both on one worker, one after the other.
    """
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    slow = [item for item in items if item.get_closest_marker("slow") is not None]
    quick = [item for item in items if item.get_closest_marker("slow") is None]
    # A file's runs stay together on one worker, so they reuse the worker processes the previous run kept
    # (ASYNCPPO_KEEP_WORKER_PROCESSES above).
    by_file: dict[str, list[pytest.Item]] = {}
    for item in slow:
        by_file.setdefault(str(item.path), []).append(item)
    shares: list[list[pytest.Item]] = [[] for _ in range(workers)]
    for index, file_items in enumerate(by_file.values()):
        shares[index % workers].extend(file_items)
    # The quick tests fill each share up to the size worksteal cuts: len(items) // workers, the remainder last.
    sizes = [len(items) // workers] * (workers - 1) + [len(items) - (len(items) // workers) * (workers - 1)]
    for share, size in zip(shares, sizes, strict=True):
        take = max(size - len(share), 0)
        share.extend(quick[:take])
        quick = quick[take:]
    shares[-1].extend(quick)
    items[:] = [item for share in shares for item in share]


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A saved TINY preset (model + tokenizer); tests must not write into it."""
    return ensure_tiny(tmp_path_factory.mktemp("model-cache"), "tiny")


@pytest.fixture(scope="session")
def shared_cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An ASYNCPPO_CACHE_DIR for the whole test session, shared by its pytest-xdist workers.

    The tiny model (and any demo policy whose recipe has no shipped build) is built into it once per suite (the
    build's lock file makes a second worker wait for the first one's result instead of building it again).
    """
    root = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):  # each worker's base temp dir lies in the session's one
        root = root.parent
    path = root / "asyncppo-cache"
    path.mkdir(exist_ok=True)
    return path


@pytest.fixture(scope="session")
def ray_cluster() -> Iterator[None]:
    """A local Ray cluster on 127.0.0.1 for the whole session (starting one costs ~4 s), shared by every test that
    runs workers through Ray (end-to-end runs, CLI benches); a CPU run places one worker per logical CPU."""
    from asyncppo.workers.ray_cluster import init_local_ray

    init_local_ray(num_cpus=4)  # logical CPUs: the scale-out tests place 2 trainer + 2 generator devices
    yield
    import ray

    ray.shutdown()


@pytest.fixture
def fresh_modules() -> Iterator[None]:
    """Modules a test imports (e.g. reward modules from its tmp directory) are forgotten afterwards: their names
    are reused by other tests."""
    before = set(sys.modules)
    yield
    for name in set(sys.modules) - before:
        del sys.modules[name]


@pytest.fixture(autouse=True)
def one_intra_op_thread() -> Iterator[None]:
    """Run torch ops on one thread, then restore the setting (it is process-wide, engine threads included).

    The tiny model's matmuls are too small to gain from a second thread, and on a busy 2-core machine each
    two-thread OpenMP region can stall for a scheduler slice (measured: 38 small linears 0.7 ms vs 600 ms).
    """
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)
