"""`asyncppo gym serve` as a user runs it: a real subprocess on the tiny model, its printed URLs, a gym rollout and
both OpenAI routes through them, and a clean exit on SIGTERM."""

import os
import queue
import re
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import yaml

openai = pytest.importorskip("openai")  # a guard only: openai is in the dev extra

REPO = Path(__file__).parents[2]
API_KEY = "serve-test-key"
START_TIMEOUT_S = 120.0
STOP_TIMEOUT_S = 30.0


def _config(tmp_path: Path) -> Path:
    """The smallest run config the loader accepts, on the tiny model and the CPU; the data path is never read."""
    tree = {
        "model": {"model_name": "tiny:tiny", "train_micro_batch_size": 2, "max_total_sequence_length": 256},
        "data": {"train_path": str(tmp_path / "unused.jsonl")},
        "generation": {"max_new_tokens": 16, "max_batch_size": 8},
        "env": {"gym": {"resources": ["math"], "max_steps": 2, "api_key": API_KEY}},
        "ppo": {
            "num_prompts_per_step": 1,
            "num_generations_per_prompt": 1,
            "max_num_steps": 1,
            "ppo_epochs": 1,
            "adv_estimator": {"name": "raw_reward", "normalize_advantages": False},
        },
        "cluster": {"device": "cpu"},
    }
    path = tmp_path / "serve.yaml"
    path.write_text(yaml.safe_dump(tree))
    return path


class Served:
    """The running command: its stdout lines arrive on a queue, read by a thread (a pipe read would block)."""

    def __init__(self, process: subprocess.Popen[str]) -> None:
        self.process = process
        self.lines: queue.Queue[str | None] = queue.Queue()
        self.printed: list[str] = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.lines.put(line.rstrip("\n"))
        self.lines.put(None)

    def wait_for(self, wanted: str, timeout_s: float) -> None:
        while wanted not in self.printed:
            line = self.lines.get(timeout=timeout_s)  # queue.Empty past the deadline fails the test
            assert line is not None, f"the command exited before printing {wanted!r}: {self.printed}"
            self.printed.append(line)

    def url(self, prefix: str) -> str:
        [line] = [line for line in self.printed if line.startswith(prefix)]
        match = re.search(r"http://127\.0\.0\.1:\d+(/v1)?", line)
        assert match is not None, line
        return match.group(0)


@pytest.fixture
def served(tmp_path: Path) -> Iterator[Served]:
    env = {**os.environ, "PYTHONWARNINGS": "ignore", "ASYNCPPO_CACHE_DIR": str(tmp_path / "cache")}
    command = [sys.executable, "-m", "asyncppo.cli.main", "gym", "serve", str(_config(tmp_path))]
    process = subprocess.Popen(
        command, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, bufsize=1
    )
    try:
        yield Served(process)
    finally:
        if process.poll() is None:  # a failed test must not leave the servers running
            process.kill()
            process.wait(STOP_TIMEOUT_S)


@pytest.mark.integration
def test_gym_serve_runs_a_rollout_answers_openai_clients_and_stops_cleanly_on_sigterm(served: Served) -> None:
    served.wait_for("ready", START_TIMEOUT_S)
    assert served.printed[0].endswith("(model 'policy')")
    policy_url, agent_url = served.url("policy server:"), served.url("agent math_simple_agent:")

    row = {
        "responses_create_params": {
            "input": [{"role": "user", "content": "What is 2+3?"}],
            "temperature": 1.0,
            "top_p": 1.0,
            "max_output_tokens": 8,
        },
        "expected_answer": "5",
    }
    # The agent's /run takes the same key as the policy server (it would otherwise lend its key to any caller).
    assert httpx.post(f"{agent_url}/run", json=row, timeout=60).status_code == 401
    result = httpx.post(f"{agent_url}/run", json=row, headers={"Authorization": f"Bearer {API_KEY}"}, timeout=60)
    assert result.status_code == 200, result.text
    assert result.json()["reward"] in (0.0, 1.0)  # the tiny model is random; the rollout and verify ran
    assert result.json()["response"]["output"][-1]["prompt_token_ids"]

    client = openai.OpenAI(base_url=policy_url, api_key=API_KEY, max_retries=0)
    chat = client.chat.completions.create(
        model="policy", messages=[{"role": "user", "content": "hi"}], temperature=1.0, top_p=1.0, max_tokens=4
    )
    assert chat.choices[0].message.model_extra["generation_token_ids"]
    response = client.responses.create(model="policy", input="hi", temperature=1.0, top_p=1.0, max_output_tokens=4)
    assert response.output[-1].model_extra["generation_token_ids"]
    assert len(response.output[-1].model_extra["generation_token_ids"]) <= 4

    served.process.send_signal(signal.SIGTERM)
    assert served.process.wait(STOP_TIMEOUT_S) == 0
    served.wait_for("stopping", 1.0)
