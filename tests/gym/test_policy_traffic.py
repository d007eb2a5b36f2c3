"""A rollout that misses its deadline while no request reached the run's policy server says so, naming the server's
address (an external gym pointed at another port); one whose agent did call the policy server is only slow.

Real servers: a PolicyServer (whose uvicorn counts the requests it receives) and an agent that hangs on `/run`."""

import asyncio
import socket
from collections.abc import Iterator
from contextlib import contextmanager

import httpx
import pytest
from gym_fakes import policy_server_of, serving
from starlette.types import Receive, Scope, Send
from transformers import PreTrainedTokenizerBase

from asyncppo.config.runtime import GymConfig, RewardPenaltiesConfig
from asyncppo.gym.client import RolloutDeadlineError
from asyncppo.gym.policy_server_runner import PolicyServer
from asyncppo.gym.runner import (
    GroupOutcome,
    GymClientSettings,
    GymRolloutRunner,
    PolicyServerNotCalledError,
    PolicyTraffic,
)
from asyncppo.types import SamplingProfile

ROW = {"responses_create_params": {"input": [{"role": "user", "content": "7+5?"}]}, "expected_answer": "12"}


@pytest.fixture
def policy_server(tokenizer: PreTrainedTokenizerBase) -> Iterator[PolicyServer]:
    with policy_server_of(object(), tokenizer) as server:  # nothing generates: no agent here gets that far
        yield server


@contextmanager
def hanging_agent(call_first: str | None) -> Iterator[str]:
    """An agent whose `/run` never answers; with `call_first`, it GETs that URL before it hangs (as an agent whose model
    server is pointed at the policy server would call it)."""

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        if call_first is not None:
            async with httpx.AsyncClient() as client:
                await client.get(call_first)
        await asyncio.sleep(3600)

    listener = socket.create_server(("127.0.0.1", 0))
    with serving(app, listener, "the hanging agent"):
        yield f"http://127.0.0.1:{listener.getsockname()[1]}"


def _run_one(agent_url: str, server: PolicyServer) -> tuple[GroupOutcome, dict[str, float]]:
    settings = GymClientSettings(
        agent_urls={"agent": agent_url},
        head_server_url=None,
        limits=GymConfig(rollout_deadline_s=0.5, max_retries=0, backoff_s=0.0),
        train_sampling=SamplingProfile(1.0, 1.0),
        validation_sampling=SamplingProfile(0.0, 1.0),
        max_output_tokens=16,
    )
    runner = GymRolloutRunner(
        settings,
        penalties=RewardPenaltiesConfig(),
        decode=lambda token_ids: "",
        policy_version=lambda: 0,
        policy_traffic=PolicyTraffic([server.url], lambda: server.requests_received),
    )
    try:
        (outcome,) = runner.run_groups([ROW], [7], 1, validation=False)
        return outcome, runner.metrics()
    finally:
        runner.close()


def test_a_deadline_missed_while_the_policy_server_heard_nothing_names_the_server(policy_server: PolicyServer):
    with hanging_agent(call_first=None) as agent_url:
        outcome, metrics = _run_one(agent_url, policy_server)
    assert isinstance(outcome, PolicyServerNotCalledError)
    assert str(outcome).startswith(f"gym agent 'agent' ({agent_url}): rollout of a row missed its deadline of 0.5 s")
    assert str(outcome).endswith(
        f"; no request reached the policy server {policy_server.url} while it ran: the gym's model server must call "
        "that address (env.gym.policy_server_port fixes the port; 0 picks a free one each run)"
    )
    assert metrics["gym/policy_server_not_called"] == 1.0


def test_a_deadline_missed_after_the_agent_called_the_policy_server_is_only_a_deadline(policy_server: PolicyServer):
    root = policy_server.url.removesuffix("/v1")
    with hanging_agent(call_first=f"{root}/health") as agent_url:
        outcome, metrics = _run_one(agent_url, policy_server)
    assert isinstance(outcome, RolloutDeadlineError) and not isinstance(outcome, PolicyServerNotCalledError)
    assert "policy_server_not_called" not in str(metrics)
