"""GymRolloutRunner: blocking rollouts of prompt groups from several threads through one GymClient on its own
event loop, against the built-in math gym and a real PolicyServer whose generator answers with fixed text."""

import json
import socket
import threading
from collections.abc import Iterator
from concurrent.futures import Future
from pathlib import Path

import pytest
from gym_fakes import policy_server_of, serving
from starlette.types import Receive, Scope, Send
from transformers import PreTrainedTokenizerBase

from asyncppo.config.runtime import GymConfig, RewardPenaltiesConfig
from asyncppo.generation.protocol import GenerationRequest, GenerationResult
from asyncppo.gym.client import AgentConnectionError
from asyncppo.gym.results import InvalidResultError
from asyncppo.gym.runner import GymClientSettings, GymRolloutRunner
from asyncppo.gym.servers.launch import BuiltinGym, launch_builtin_gym
from asyncppo.models.tiny import EOS_TOKEN_ID
from asyncppo.types import SamplingProfile


class Answers:
    """A Generator that always answers `text` + EOS and records each request's sampling."""

    def __init__(self, tokenizer: PreTrainedTokenizerBase, text: str) -> None:
        self.tokens = (*tokenizer.encode(text, add_special_tokens=False), EOS_TOKEN_ID)
        self.greedy: list[bool] = []
        self._lock = threading.Lock()

    def submit(self, request: GenerationRequest) -> "Future[GenerationResult]":
        with self._lock:
            self.greedy.append(request.sampling.greedy)
        future: Future[GenerationResult] = Future()
        future.set_result(GenerationResult(self.tokens, (-0.25,) * len(self.tokens), "stop", 3, 3))
        return future


@pytest.fixture
def gym(tokenizer: PreTrainedTokenizerBase) -> Iterator[tuple[BuiltinGym, Answers]]:
    answers = Answers(tokenizer, "The answer is 12.")
    server = policy_server_of(answers, tokenizer, max_model_len=256)
    with server, launch_builtin_gym(server.url, resources=("math",), max_steps=1) as builtin:
        yield builtin, answers


FIXTURES = Path(__file__).parent / "fixtures"


@pytest.fixture
def nan_agent() -> Iterator[str]:
    """An agent whose every `/run` answers the two-turn fixture with `"reward": NaN` (Python's json reads it)."""
    result = (FIXTURES / "run_result_two_turn_tool_call.json").read_text()
    body = json.dumps({**json.loads(result), "reward": float("nan"), "reward_components": None}).encode()

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        while (await receive()).get("more_body"):
            pass
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"application/json")]})
        await send({"type": "http.response.body", "body": body})

    listener = socket.create_server(("127.0.0.1", 0))
    with serving(app, listener, "the NaN agent"):
        yield f"http://127.0.0.1:{listener.getsockname()[1]}"


def make_runner(
    head_url: str | None,
    version: list[int],
    penalties: RewardPenaltiesConfig | None = None,
    results_log: Path | None = None,
    agent_urls: dict[str, str] | None = None,
) -> GymRolloutRunner:
    settings = GymClientSettings(
        agent_urls=agent_urls,
        head_server_url=head_url,
        limits=GymConfig(max_concurrency=8, rollout_deadline_s=30, max_retries=0, backoff_s=0.0),
        train_sampling=SamplingProfile(1.0, 1.0),
        validation_sampling=SamplingProfile(0.0, 1.0),
        max_output_tokens=16,
    )
    return GymRolloutRunner(
        settings,
        penalties=penalties or RewardPenaltiesConfig(),
        decode=decode,
        policy_version=lambda: version[0],
        results_log=results_log,
    )


def decode(token_ids) -> str:
    return " ".join(str(token) for token in token_ids)


def row(expected: str, agent: str = "math_simple_agent") -> dict:
    return {
        "responses_create_params": {"input": [{"role": "user", "content": "7+5?"}]},
        "expected_answer": expected,
        "agent_ref": {"type": "responses_api_agents", "name": agent},
    }


@pytest.mark.integration
def test_groups_from_several_threads_share_one_client_and_failures_come_back_as_values(gym):
    builtin, answers = gym
    version = [3]
    runner = make_runner(builtin.head_url, version)
    try:
        assert runner.agent_urls() == builtin.agent_urls
        outcomes: dict[int, list] = {}

        def worker(index: int) -> None:
            rows = [row("12"), row("13"), row("12", agent="no_such_agent")]
            outcomes[index] = runner.run_groups(rows, [10 * index, 10 * index + 1, 10 * index + 2], 2, False)

        threads = [threading.Thread(target=worker, args=(index,)) for index in range(3)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(30)
        for index, (right, wrong, failed) in outcomes.items():
            assert [t.reward for t in right] == [1.0, 1.0] and [t.reward for t in wrong] == [0.0, 0.0]
            assert [t.group_id for t in right] == [10 * index] * 2 and [t.sample_index for t in right] == [0, 1]
            assert all(t.policy_version == 3 for t in right + wrong)
            assert isinstance(failed, ValueError) and "no_such_agent" in str(failed)
        metrics = runner.metrics()
        assert metrics["gym/rollouts_succeeded"] == 3 * 2 * 2 and metrics["gym/failed_groups"] == 3
        assert not any(answers.greedy)
        validation = runner.run_groups([row("12")], [0], 1, validation=True)
        assert [t.reward for t in validation[0]] == [1.0]  # type: ignore[union-attr]
        assert answers.greedy[-1]  # the validation profile (temperature 0) decodes greedily
    finally:
        runner.close()
    runner.close()  # idempotent


@pytest.mark.integration
def test_an_unreachable_agent_is_a_failed_group_not_an_exception(gym):
    builtin, _ = gym
    runner = make_runner(builtin.head_url, [0])
    try:
        runner.agent_urls()  # looked up while the head server runs
        builtin.stop()
        (outcome,) = runner.run_groups([row("12")], [0], 1, False)
        assert isinstance(outcome, AgentConnectionError)
        assert runner.metrics()["gym/failures/connection"] == 1.0
    finally:
        runner.close()


@pytest.mark.integration
def test_penalties_zero_rewards_and_every_raw_result_is_logged(gym, tokenizer, tmp_path):
    builtin, answers = gym
    unwanted = answers.tokens[0]  # the first generated token of every answer
    penalties = RewardPenaltiesConfig(penalize_unwanted_tokens=True, token_ids_unwanted=[unwanted])
    runner = make_runner(builtin.head_url, [0], penalties=penalties, results_log=tmp_path / "results.jsonl")
    try:
        (group,) = runner.run_groups([row("12")], [4], 2, False)
        assert [t.reward for t in group] == [0.0, 0.0]  # type: ignore[union-attr]  # right answers, penalised
        assert runner.metrics()["gym/penalties/unwanted_tokens"] == 2
    finally:
        runner.close()
    records = [json.loads(line) for line in (tmp_path / "results.jsonl").read_text().splitlines()]
    assert sorted((r["group_id"], r["sample_index"]) for r in records) == [(4, 0), (4, 1)]
    assert all(r["result"]["reward"] == 1.0 for r in records)  # the log keeps what the environment said


@pytest.mark.integration
def test_a_nan_reward_is_a_failed_group_naming_the_agent_and_row_and_counted(nan_agent):
    runner = make_runner(None, [0], agent_urls={"nan_agent": nan_agent})
    try:
        good_row = row("12", agent="nan_agent")
        (outcome,) = runner.run_groups([good_row], [9], 2, False)
        assert isinstance(outcome, InvalidResultError)
        assert "agent 'nan_agent', prompt group 9 sample " in str(outcome)
        assert '"expected_answer": "12"' in str(outcome) and "`reward` is NaN, expected a finite number" in str(outcome)
        metrics = runner.metrics()
        assert metrics["gym/failed_groups"] == 1 and metrics["gym/invalid_results"] == 1
    finally:
        runner.close()
