"""What `asyncppo train` refuses once the config has loaded and before Ray starts: a run directory it cannot create, a
stop token id outside the tokenizer's vocabulary, an external gym that does not answer. Each is one `error:` line and
exit 2 (`main` in-process, Ray's start replaced by a tripwire); and a gym that comes up during the wait is waited for.
"""

import http.server
import json
import re
import socket
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from asyncppo.cli.main import main
from asyncppo.config import ConfigError, validate_tree
from asyncppo.trainer.gym_setup import wait_for_external_gym
from ppo_settings import tiny_run_tree

REPO = Path(__file__).parents[2]
GYM_ROWS = REPO / "examples" / "data" / "multi_step" / "train.jsonl"
pytestmark = pytest.mark.usefixtures("ray_tripwire")


@pytest.fixture(autouse=True)
def _shared_cache(shared_cache_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ASYNCPPO_CACHE_DIR", str(shared_cache_dir))  # the tiny model, built once per session


def _tree(tmp_path: Path) -> dict[str, Any]:
    rows = tmp_path / "train.jsonl"
    rows.write_text("".join(json.dumps({"prompt": f"{n}+1=", "answer": str(n + 1)}) + "\n" for n in range(4)))
    tree = tiny_run_tree(str(rows))
    tree["data"]["validation_fraction"] = 0.5
    tree["logger"] = {"log_dir": str(tmp_path / "run"), "console": False, "tensorboard_enabled": False}
    return tree


def _gym_tree(tmp_path: Path, head_server_url: str, startup_timeout_s: float) -> dict[str, Any]:
    tree = _tree(tmp_path)
    tree["data"]["train_path"] = str(GYM_ROWS)
    tree["env"] = {
        "should_use_nemo_gym": True,
        "gym": {"launch": "external", "head_server_url": head_server_url, "startup_timeout_s": startup_timeout_s},
    }
    return tree


def _only_error(capsys: pytest.CaptureFixture[str], tmp_path: Path, tree: dict[str, Any], *args: str) -> str:
    """Train `tree`'s config with `args`; assert exit 2, one `error:` line and no traceback; return the line."""
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump(tree))
    status = main(["train", str(config), *args])
    captured = capsys.readouterr()
    assert status == 2, captured.err
    assert captured.err.count("\n") == 1 and captured.err.startswith("error: "), captured.err
    assert "Traceback" not in captured.err
    return captured.err.removeprefix("error: ").removesuffix("\n")


def test_a_run_directory_that_is_a_file_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    (tmp_path / "a_file").write_text("")
    line = _only_error(capsys, tmp_path, _tree(tmp_path), "--run-dir", str(tmp_path / "a_file"))
    assert (
        line == f"run directory: '{tmp_path}/a_file' is a file; expected a directory, or a path where one can be made"
    )


def test_a_run_directory_under_proc_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    line = _only_error(capsys, tmp_path, _tree(tmp_path), "--run-dir", "/proc/asyncppo/run")
    assert line.startswith(
        "run directory: '/proc/asyncppo/run' is not writable: cannot create a directory in '/proc', where it would be "
        "created ("
    )


@pytest.mark.parametrize(
    ("run_dir", "problem"),
    [
        pytest.param("x" * 300 + "/run", "is not writable: cannot create a directory in '{tmp}', where it", id="long"),
        pytest.param("loop/run", "lies under '{tmp}/loop', which is a symbolic link to nothing (a loop", id="loop"),
    ],
)
def test_a_run_directory_that_cannot_be_made_for_other_reasons_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], run_dir: str, problem: str
):
    (tmp_path / "loop").symlink_to(tmp_path / "loop")
    line = _only_error(capsys, tmp_path, _tree(tmp_path), "--run-dir", str(tmp_path / run_dir))
    assert problem.format(tmp=tmp_path) in line
    assert sorted(path.name for path in tmp_path.iterdir()) == ["config.yaml", "loop", "train.jsonl"]  # none made


def test_a_stop_token_id_outside_the_vocabulary_is_refused_once_the_tokenizer_loads(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
):
    tree = _tree(tmp_path)
    tree["generation"]["stop_token_ids"] = [5, 300]  # the tiny tokenizer has ids 0..299
    line = _only_error(capsys, tmp_path, tree)
    assert line.startswith("generation.stop_token_ids: 300 is outside the vocabulary of the tokenizer at ")
    assert line.endswith(" (300 ids: 0 to 299)")


@pytest.fixture
def closed_port() -> Iterator[socket.socket]:
    """A bound socket that does not listen yet: connections to its port are refused until `_serve_later` serves."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    yield sock
    sock.close()


def _serve_later(sock: socket.socket, delay_s: float) -> http.server.HTTPServer:
    """After `delay_s`, answer every request on `sock` (501: no route at all, which still counts as an answer)."""
    server = http.server.HTTPServer(sock.getsockname(), http.server.BaseHTTPRequestHandler, bind_and_activate=False)
    server.socket = sock

    def serve() -> None:
        server.server_activate()
        server.serve_forever(poll_interval=0.05)

    timer = threading.Timer(delay_s, serve)
    timer.daemon = True
    timer.start()
    return server


def test_an_unreachable_gym_without_a_wait_is_refused_naming_the_url_and_the_key(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], closed_port: socket.socket
):
    url = f"http://127.0.0.1:{closed_port.getsockname()[1]}"
    line = _only_error(capsys, tmp_path, _gym_tree(tmp_path, url, startup_timeout_s=0))
    assert line == (
        f"env.gym.head_server_url: {url} does not answer (ConnectError: [Errno 111] Connection refused) "
        "(env.gym.startup_timeout_s=0: no wait); start the gym servers first, or fix the URL"
    )
    assert not (tmp_path / "run").exists()


def test_a_gym_still_silent_after_the_wait_is_refused_saying_how_long(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], closed_port: socket.socket
):
    url = f"http://127.0.0.1:{closed_port.getsockname()[1]}"
    with pytest.raises(ConfigError) as raised:
        wait_for_external_gym(validate_tree(_gym_tree(tmp_path, url, startup_timeout_s=0.5)))
    (line,) = raised.value.lines
    assert re.fullmatch(
        rf"env\.gym\.head_server_url: {url} does not answer \(ConnectError: \[Errno 111\] Connection refused\) after "
        r"\d+ s \(env\.gym\.startup_timeout_s=0\.5\); start the gym servers first, or fix the URL",
        line,
    )
    assert capsys.readouterr().out == (
        f"gym: env.gym.head_server_url {url} does not answer (ConnectError: [Errno 111] Connection refused); waiting "
        "up to 0.5 s (env.gym.startup_timeout_s)\n"
    )


def test_a_gym_that_comes_up_during_the_wait_is_waited_for(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], closed_port: socket.socket
):
    url = f"http://127.0.0.1:{closed_port.getsockname()[1]}"
    server = _serve_later(closed_port, delay_s=0.3)
    try:
        wait_for_external_gym(validate_tree(_gym_tree(tmp_path, url, startup_timeout_s=30)))
    finally:
        server.shutdown()
    first, second = capsys.readouterr().out.splitlines()
    assert first == (
        f"gym: env.gym.head_server_url {url} does not answer (ConnectError: [Errno 111] Connection refused); waiting "
        "up to 30 s (env.gym.startup_timeout_s)"
    )
    assert second.startswith(f"gym: env.gym.head_server_url {url} answers (after ")


def test_a_gym_url_without_a_scheme_is_refused_at_once(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    tree = _gym_tree(tmp_path, "unused", startup_timeout_s=30)
    del tree["env"]["gym"]["head_server_url"]
    tree["env"]["gym"]["agent_urls"] = {"math_simple_agent": "localhost:8000"}
    with pytest.raises(ConfigError) as raised:
        wait_for_external_gym(validate_tree(tree))
    assert raised.value.lines == [
        "env.gym.agent_urls.math_simple_agent: 'localhost:8000' is not an http:// or https:// URL (Request URL is "
        "missing an 'http://' or 'https://' protocol.); fix it"
    ]
    assert capsys.readouterr().out == ""  # no wait: waiting would not fix it
