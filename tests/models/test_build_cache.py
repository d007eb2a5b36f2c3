"""build_once: a slow build says that it starts and how long it took; a cached directory prints nothing."""

import multiprocessing
import time
from pathlib import Path

import pytest

from asyncppo.models.build_cache import build_once


def write_marker(directory: Path) -> None:
    (directory / "marker").write_text("built")


def test_an_announced_build_prints_a_line_before_and_after_and_nothing_once_cached(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    final = tmp_path / "models" / "thing"
    assert build_once(final, write_marker, "the thing (slow)") == final
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == f"building the thing (slow), once; cached in {tmp_path / 'models'} ..."
    assert lines[1].startswith("built in ") and lines[1].endswith(f" s: {final}")
    assert len(lines) == 2
    assert build_once(final, write_marker, "the thing (slow)") == final
    assert capsys.readouterr().out == ""


def test_an_unannounced_build_prints_nothing(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    build_once(tmp_path / "thing", write_marker)
    assert capsys.readouterr().out == ""


def _count_and_build_slowly(directory: Path) -> None:
    counter = directory.parent / "builds"
    with counter.open("a") as out:
        out.write("x")
    time.sleep(1.0)
    write_marker(directory)


def _build_in_subprocess(final: str) -> None:
    build_once(Path(final), _count_and_build_slowly)


def test_processes_needing_the_same_build_at_once_build_it_once(tmp_path: Path) -> None:
    final = tmp_path / "models" / "thing"
    context = multiprocessing.get_context("spawn")
    processes = [context.Process(target=_build_in_subprocess, args=(str(final),)) for _ in range(3)]
    for process in processes:
        process.start()
    for process in processes:
        process.join(timeout=60)
        assert process.exitcode == 0
    assert (final / "marker").read_text() == "built"
    assert (tmp_path / "models" / "builds").read_text() == "x"  # the others waited and found it built
