"""`asyncppo bench generate` as a user runs it on CPU: one table row per backend and case, errors in one line."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from asyncppo.cli.main import main

REPO = Path(__file__).parents[2]


def _asyncppo(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONWARNINGS": "ignore", "ASYNCPPO_CACHE_DIR": str(tmp_path / "cache")}
    return subprocess.run(
        [sys.executable, "-m", "asyncppo", *args], cwd=REPO, capture_output=True, text=True, env=env, timeout=300
    )


def test_bench_generate_prints_one_row_per_backend_and_case(tmp_path: Path) -> None:
    result = _asyncppo(
        tmp_path,
        "bench",
        "generate",
        "examples/configs/demo.yaml",
        "model.model_name=tiny:tiny",
        "--batch-sizes",
        "4",
        "--prompt-tokens",
        "8",
        "--new-tokens",
        "6",
        "--variable-new-tokens",
        "20",
    )
    assert result.returncode == 0, result.stderr
    rows = [line.split("|")[1:-1] for line in result.stdout.splitlines() if line.startswith("| ") and "---" not in line]
    header, body = rows[0], rows[1:]
    assert [cell.strip() for cell in header[:3]] == ["backend", "case", "batch"]
    assert [(row[0].strip(), row[1].strip()) for row in body] == [
        ("graph", "fixed"),
        ("graph", "variable"),
        ("hf", "fixed"),
    ]
    for row in body:
        tokens_per_second = float(row[5].replace(",", ""))
        assert tokens_per_second > 0


def test_bench_generate_rejects_an_unknown_backend_in_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    # In-process (a process start costs ~8 s): the exit status and stderr are the command's `main`'s.
    assert main(["bench", "generate", str(REPO / "examples/configs/demo.yaml"), "--backends", "vllm"]) == 2
    assert capsys.readouterr().err == "error: --backends: unknown ['vllm']; expected graph and/or hf\n"
