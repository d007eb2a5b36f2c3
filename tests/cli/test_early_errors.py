"""`asyncppo train` and `asyncppo config check` report config and pre-flight mistakes before torch, transformers or
Ray are imported (importing them takes 10 s or more on a busy machine; a mistyped key is answered in about half a
second). The subprocess test proves the imports for both commands; the in-process ones pin the run directory's
lines and that the run setup takes the pre-flight's result instead of checking again."""

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from in_process import REPO, run_asyncppo

from asyncppo.config import validate_tree
from asyncppo.rollout.rewards import exact_match_reward
from asyncppo.trainer.preflight import CheckedInputs
from asyncppo.trainer.setup import resolve_setup
from ppo_settings import tiny_run_tree

DEMO = str(REPO / "examples" / "configs" / "demo.yaml")
HEAVY_MODULES = ("torch", "transformers", "ray")

# Runs `main(argv)` for each argv (a JSON list in argv[1]) in one fresh interpreter, then reports each call's exit
# status, stdout and stderr, and which of the heavy modules had been imported by then.
RUN_COMMANDS = f"""
import contextlib, io, json, sys
from asyncppo.cli.main import main
results = []
for argv in json.loads(sys.argv[1]):
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        status = main(argv)
    results.append([status, out.getvalue(), err.getvalue()])
print(json.dumps({{"results": results, "heavy": [m for m in {HEAVY_MODULES!r} if m in sys.modules]}}))
"""


def _tree(train_path: Path, reward_function: str, log_dir: Path) -> dict[str, Any]:
    """A small valid single-turn run on the tiny model (its inputs are what the tests vary)."""
    tree = tiny_run_tree(str(train_path), reward_function)
    tree["data"]["validation_fraction"] = 0.5
    tree["logger"] = {"log_dir": str(log_dir)}
    return tree


def _write_config(tmp_path: Path, tree: dict[str, Any], name: str = "run.yaml") -> str:
    path = tmp_path / name
    path.write_text(yaml.safe_dump(tree))
    return str(path)


def _rows_file(tmp_path: Path) -> Path:
    path = tmp_path / "train.jsonl"
    path.write_text("".join(json.dumps({"prompt": f"{n}+1=", "answer": str(n + 1)}) + "\n" for n in range(4)))
    return path


def test_a_typo_and_each_pre_flight_mistake_are_reported_before_torch_transformers_or_ray_load(tmp_path: Path):
    a_file = tmp_path / "a_file"
    a_file.write_text("")
    good = _write_config(tmp_path, _tree(_rows_file(tmp_path), "exact_match", tmp_path / "runs" / "good"))
    bad = _write_config(tmp_path, _tree(tmp_path / "missing.jsonl", "no_such_reward_module:reward", a_file), "bad.yaml")
    commands = [
        ["train", DEMO, "model.nmae=x"],
        ["config", "check", DEMO, "model.nmae=x"],
        ["train", bad],
        ["config", "check", bad],
        ["config", "check", good],
    ]
    result = subprocess.run(
        [sys.executable, "-c", RUN_COMMANDS, json.dumps(commands)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(result.stdout.splitlines()[-1])
    assert report["heavy"] == []  # after all five commands, the last one a valid config's full pre-flight
    typo, check_typo, train_bad, check_bad, check_good = report["results"]
    assert typo == [2, "", "error: model.nmae: unknown key\n"]
    assert check_typo == typo
    expected = [
        f"error: env.reward_function: cannot import module 'no_such_reward_module' (ModuleNotFoundError: No module "
        f"named 'no_such_reward_module'); the config's directory {tmp_path} and the working directory {tmp_path} are "
        "on the import path: put no_such_reward_module.py there, or install the module",
        f"error: data.train_path: '{tmp_path / 'missing.jsonl'}' does not exist (relative paths resolve from the "
        f"working directory {tmp_path}); give the path of a .jsonl file or of a datasets save_to_disk directory",
        f"error: logger.log_dir: '{a_file}' is a file; expected a directory, or a path where one can be made",
    ]
    assert train_bad == [2, "", "\n".join(expected) + "\n"]
    assert check_bad == train_bad
    assert check_good == [
        0,
        f"ok: {good}: 2 training rows, 2 validation rows, reward exact_match, run directory {tmp_path / 'runs/good'}\n",
        "",
    ]
    assert not (tmp_path / "runs").exists()  # the check probes where it would create the directory, and cleans up


@pytest.mark.parametrize(
    ("run_dir", "problem"),
    [
        pytest.param("a_file", "is a file", id="a_file"),
        pytest.param("a_file/run", "lies under '{tmp}/a_file', which is a file", id="under_a_file"),
    ],
)
def test_config_check_refuses_a_run_directory_that_is_or_lies_under_a_file(tmp_path: Path, run_dir: str, problem: str):
    (tmp_path / "a_file").write_text("")
    config = _write_config(tmp_path, _tree(_rows_file(tmp_path), "exact_match", tmp_path / "runs"))
    result = run_asyncppo("config", "check", config, "--run-dir", str(tmp_path / run_dir))
    assert result.returncode == 2
    assert result.stderr == (
        f"error: run directory: '{tmp_path / run_dir}' {problem.format(tmp=tmp_path)}; expected a directory, or a "
        "path where one can be made\n"
    )


def test_config_check_refuses_a_run_directory_under_proc(tmp_path: Path):
    config = _write_config(tmp_path, _tree(_rows_file(tmp_path), "exact_match", tmp_path / "runs"))
    result = run_asyncppo("config", "check", config, "logger.log_dir=/proc/asyncppo/run")
    assert result.returncode == 2
    # /proc has no asyncppo entry and takes no new one: the nearest existing directory, /proc, is named.
    assert result.stderr.startswith(
        "error: logger.log_dir: '/proc/asyncppo/run' is not writable: cannot create a directory in '/proc', where it "
        "would be created ("
    )
    assert result.stderr.endswith("); choose a directory this process can write in\n")
    assert result.stderr.count("\n") == 1


def test_the_run_setup_takes_the_pre_flight_result_instead_of_checking_again(
    tmp_path: Path, shared_cache_dir: Path, monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.setenv("ASYNCPPO_CACHE_DIR", str(shared_cache_dir))
    # The data file does not exist: a second pre-flight would refuse the run; the result handed in is used instead.
    config = validate_tree(_tree(tmp_path / "missing.jsonl", "exact_match", tmp_path / "runs"))
    inputs = CheckedInputs([{"prompt": "1+1=", "answer": "2"}], [], exact_match_reward)
    assert resolve_setup(config, data=True, inputs=inputs).checked_inputs is inputs
