"""GymClient against a scripted FastAPI agent served by uvicorn in a thread on 127.0.0.1 (gym/client.py).

Each `/run` pops the next behaviour of the agent's script (the last one repeats): `ok` answers the canned
two-turn result, `500`/`400` that status, `hang` sleeps past any test deadline, `drop` closes the
connection mid-body, `malformed` answers 200 with a body that is not JSON, `judge_failed` answers the canned
result as Gym's judge failsafe rewrites it (reward 0, `_ng_failure_class: judge_failed`), `cut` answers it cut
by the agent's step limit (its first model call, a tool call, and the tool's output; status `completed`), and
`wrapped_404` / `wrapped_400` / `wrapped_crash` answer 500 with the fixture body of that name: NeMo-Gym's nested
500 around a policy-server error (tests/gym/test_error_bodies.py describes them). The head config gives the agent
`max_steps: 1`, as a NeMo-Gym simple_agent config does.
"""

import asyncio
import json
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from gym_fakes import serving
from starlette.types import ASGIApp, Receive, Scope, Send

from asyncppo.gym.client import (
    AgentHTTPError,
    GymClient,
    MalformedResultError,
    RolloutDeadlineError,
    agent_step_limits_from_config,
    agent_urls_from_config,
)
from asyncppo.gym.results import StepLimit
from asyncppo.types import SamplingProfile, Trajectory

CANNED_RESULT = json.loads((Path(__file__).parent / "fixtures" / "run_result_two_turn_tool_call.json").read_text())
JUDGE_FAILED_RESULT = {key: value for key, value in CANNED_RESULT.items() if key != "reward_components"} | {
    "reward": 0.0,
    "_ng_failure_class": "judge_failed",
    "_ng_failure_judge_error": "judge model answered 503",
}
CUT_RESULT = CANNED_RESULT | {
    "response": CANNED_RESULT["response"] | {"output": CANNED_RESULT["response"]["output"][:3]}
}
WRAPPED_BODIES = {
    "wrapped_404": "run_500_wrapped_policy_404.json",
    "wrapped_400": "run_500_wrapped_policy_400_context_length.json",
    "wrapped_crash": "run_500_wrapped_policy_crash.json",
}
HANG_S = 3.0


class ScriptedAgent:
    """The agent's state: the behaviour script and every `/run` body it received."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.script: list[str] = ["ok"]
        self.bodies: list[dict[str, Any]] = []

    def next_behaviour(self) -> str:
        return self.script.pop(0) if len(self.script) > 1 else self.script[0]


def build_app(agent: ScriptedAgent) -> ASGIApp:
    app = FastAPI()

    @app.get("/global_config_dict_yaml")
    async def global_config() -> str:
        yaml_text = (
            "head_server:\n  host: 127.0.0.1\n  port: 1\n"
            "synonym_agent:\n  responses_api_agents:\n    simple_agent:\n"
            f"      host: 127.0.0.1\n      port: {agent.port}\n      max_steps: 1\n"
            "synonym_resources:\n  resources_servers:\n    example_multi_step:\n      host: 127.0.0.1\n      port: 2\n"
        )
        return yaml_text  # FastAPI encodes it as a JSON string, as the head server does

    @app.post("/run")
    async def run(request: Request) -> Response:
        agent.bodies.append(await request.json())
        behaviour = agent.next_behaviour()
        if behaviour == "hang":
            await asyncio.sleep(HANG_S)
        if behaviour in ("500", "400"):
            return JSONResponse(f"Hit an exception in SimpleAgent: status {behaviour}", status_code=int(behaviour))
        if behaviour == "malformed":
            return Response(b'{"reward": 1.0, "response": ', media_type="application/json")
        if behaviour == "judge_failed":
            return JSONResponse(JUDGE_FAILED_RESULT)
        if behaviour == "cut":
            return JSONResponse(CUT_RESULT)
        if behaviour in WRAPPED_BODIES:
            body = (Path(__file__).parent / "fixtures" / WRAPPED_BODIES[behaviour]).read_bytes()
            return Response(body, status_code=500, media_type="application/json")
        return JSONResponse(CANNED_RESULT)

    async def dropping_app(scope: Scope, receive: Receive, send: Send) -> None:
        """Promise a body, send part of it, then fail: uvicorn closes the connection mid-response."""
        if scope["type"] == "http" and scope["path"] == "/run" and agent.script[0] == "drop":
            agent.next_behaviour()
            headers = [(b"content-type", b"application/json"), (b"content-length", b"1000")]
            await send({"type": "http.response.start", "status": 200, "headers": headers})
            await send({"type": "http.response.body", "body": b"{", "more_body": True})
            raise ConnectionAbortedError("scripted drop")
        await app(scope, receive, send)

    return dropping_app


@pytest.fixture(scope="module")
def served_agent() -> Iterator[ScriptedAgent]:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    agent = ScriptedAgent(sock.getsockname()[1])
    with serving(build_app(agent), sock, "the fake agent"):
        yield agent


@pytest.fixture
def agent(served_agent: ScriptedAgent) -> ScriptedAgent:
    served_agent.script = ["ok"]
    served_agent.bodies.clear()
    return served_agent


def make_client(
    agent: ScriptedAgent,
    *,
    head: bool = False,
    deadline_s: float = 5.0,
    max_retries: int = 3,
    agent_names: tuple[str, ...] = ("synonym_agent",),
    default_agent: str | None = None,
) -> GymClient:
    url = f"http://127.0.0.1:{agent.port}"
    return GymClient(
        None if head else dict.fromkeys(agent_names, url),
        url if head else None,
        max_concurrency=4,
        rollout_deadline_s=deadline_s,
        max_retries=max_retries,
        backoff_s=0.01,
        train_sampling=SamplingProfile(temperature=1.0, top_p=1.0),
        validation_sampling=SamplingProfile(temperature=0.6, top_p=0.95),
        max_output_tokens=8,
        default_agent=default_agent,
    )


def run_once(client: GymClient, row: dict[str, Any], *, validation: bool = False) -> dict[str, Any]:
    async def main() -> dict[str, Any]:
        async with client:
            return await client.run(row, validation=validation)

    return asyncio.run(main())


def make_row() -> dict[str, Any]:
    return {
        "responses_create_params": {"input": [{"role": "user", "content": "Blazing?"}], "max_output_tokens": 64},
        "agent_ref": {"type": "responses_api_agents", "name": "synonym_agent"},
        "expected_answer": "711",
        "_rowidx": 3,
    }


def test_run_stamps_a_copy_of_the_row_and_returns_the_result(agent: ScriptedAgent) -> None:
    row = make_row()
    original = json.loads(json.dumps(row))
    client = make_client(agent)
    assert run_once(client, row, validation=True) == CANNED_RESULT
    assert row == original
    params = agent.bodies[0]["responses_create_params"]
    # Validation profile; max_output_tokens = min(row 64, client 8); nothing else sampling-related added.
    assert (params["temperature"], params["top_p"], params["max_output_tokens"]) == (0.6, 0.95, 8)
    assert "top_k" not in params and "stop" not in params
    assert agent.bodies[0]["expected_answer"] == "711"
    assert client.metrics()["gym/rollouts_succeeded"] == 1.0


def test_head_server_config_resolves_the_agent() -> None:
    yaml_config = {"a": {"responses_api_agents": {"simple_agent": {"host": "10.0.0.5", "port": 5011}}}, "b": {}}
    assert agent_urls_from_config(yaml_config) == {"a": "http://10.0.0.5:5011"}


def test_head_server_lookup_then_run(agent: ScriptedAgent) -> None:
    client = make_client(agent, head=True)
    assert run_once(client, make_row()) == CANNED_RESULT


def test_server_errors_are_retried_until_success(agent: ScriptedAgent) -> None:
    agent.script = ["500", "500", "ok"]
    client = make_client(agent)
    assert run_once(client, make_row()) == CANNED_RESULT
    metrics = client.metrics()
    assert metrics["gym/retries"] == 2.0
    assert metrics["gym/failures/http_500"] == 2.0
    assert len(agent.bodies) == 3


def test_server_errors_past_the_retry_budget_raise(agent: ScriptedAgent) -> None:
    agent.script = ["500"]
    client = make_client(agent, max_retries=1)
    with pytest.raises(AgentHTTPError, match="answered 500"):
        run_once(client, make_row())
    assert len(agent.bodies) == 2


def test_client_errors_are_not_retried(agent: ScriptedAgent) -> None:
    agent.script = ["400", "ok"]
    client = make_client(agent)
    with pytest.raises(AgentHTTPError, match=r"answered 400: .*status 400") as raised:
        run_once(client, make_row())
    assert raised.value.status == 400
    assert len(agent.bodies) == 1
    assert client.metrics().get("gym/retries", 0.0) == 0.0


def test_hung_agent_misses_the_deadline_in_bounded_time(agent: ScriptedAgent) -> None:
    agent.script = ["hang"]
    client = make_client(agent, deadline_s=0.3)
    start = time.monotonic()
    with pytest.raises(RolloutDeadlineError, match=r"'synonym_agent'.*row 3.*deadline of 0\.3 s"):
        run_once(client, make_row())
    assert time.monotonic() - start < HANG_S / 2
    assert client.metrics()["gym/deadline_misses"] == 1.0


def test_dropped_connection_is_retried(agent: ScriptedAgent) -> None:
    agent.script = ["drop", "ok"]
    client = make_client(agent)
    assert run_once(client, make_row()) == CANNED_RESULT
    assert client.metrics()["gym/failures/connection"] == 1.0
    assert client.metrics()["gym/retries"] == 1.0


def test_malformed_json_raises_quoting_the_body(agent: ScriptedAgent) -> None:
    agent.script = ["malformed"]
    client = make_client(agent)
    with pytest.raises(MalformedResultError, match=r'not JSON .*"reward": 1\.0, "response":'):
        run_once(client, make_row())
    assert len(agent.bodies) == 1


def test_run_group_converts_every_sample_in_order(agent: ScriptedAgent) -> None:
    client = make_client(agent)

    async def main():
        async with client:
            return await client.run_group(make_row(), num_generations=3, group_id=11, policy_version=4)

    trajectories = asyncio.run(main())
    assert [trajectory.sample_index for trajectory in trajectories] == [0, 1, 2]
    assert {trajectory.group_id for trajectory in trajectories} == {11}
    assert all(trajectory.token_ids == list(range(1, 12)) for trajectory in trajectories)
    assert trajectories[0].task["expected_answer"] == "711"
    assert "_ng_task_index" not in trajectories[0].task  # the task is the caller's row, not the stamped copy
    assert len(agent.bodies) == 3
    stamps = sorted((body["_ng_task_index"], body["_ng_rollout_index"]) for body in agent.bodies)
    assert stamps == [(11, 0), (11, 1), (11, 2)]


def test_run_group_raises_the_first_failure_of_its_samples(agent: ScriptedAgent) -> None:
    agent.script = ["400"]
    client = make_client(agent)

    async def main():
        async with client:
            return await client.run_group(make_row(), num_generations=2, group_id=11, policy_version=4)

    with pytest.raises(AgentHTTPError, match="answered 400"):
        asyncio.run(main())


def test_judge_failures_are_returned_as_reward_zero_and_counted(agent: ScriptedAgent) -> None:
    agent.script = ["judge_failed", "ok", "judge_failed"]
    client = make_client(agent)

    async def main():
        async with client:
            return await client.run_group(make_row(), num_generations=3, group_id=11, policy_version=4)

    trajectories = asyncio.run(main())
    assert sorted(trajectory.reward for trajectory in trajectories) == [0.0, 0.0, 1.0]  # trained, not dropped
    metrics = client.metrics()
    assert metrics["gym/judge_failures"] == 2.0 and metrics["gym/rollouts_succeeded"] == 3.0
    assert metrics.get("gym/retries", 0.0) == 0.0  # a judge failure is a result, not a transport failure


def test_results_without_a_failure_class_count_no_judge_failure(agent: ScriptedAgent) -> None:
    client = make_client(agent)
    run_once(client, make_row())
    assert "gym/judge_failures" not in client.metrics()


def test_unknown_agent_name_is_a_value_error(agent: ScriptedAgent) -> None:
    row = make_row()
    row["agent_ref"]["name"] = "missing_agent"
    with pytest.raises(ValueError, match="'missing_agent' is not a known agent"):
        run_once(make_client(agent), row)


@pytest.mark.parametrize(
    ("behaviour", "status", "message"),
    [
        ("wrapped_404", 404, "The model `policy-typo` does not exist."),
        ("wrapped_400", 400, "This model's maximum context length is 1024 tokens, but the prompt has 1100 tokens, "),
    ],
)
def test_a_policy_client_error_wrapped_in_nemo_gyms_500_is_quoted_and_not_retried(
    agent: ScriptedAgent, behaviour: str, status: int, message: str
) -> None:
    agent.script = [behaviour, "ok"]
    client = make_client(agent)
    with pytest.raises(AgentHTTPError) as raised:
        run_once(client, make_row())
    assert raised.value.status == 500 and raised.value.inner_client_status == status
    assert f"answered 500 (policy server {status}), through SimpleAgent___math_simple_agent" in str(raised.value)
    assert message in str(raised.value)
    assert len(agent.bodies) == 1  # a rerun would be refused the same way
    assert client.metrics().get("gym/retries", 0.0) == 0.0


def test_a_policy_crash_wrapped_in_nemo_gyms_500_is_retried_and_quoted(agent: ScriptedAgent) -> None:
    agent.script = ["wrapped_crash"]
    client = make_client(agent, max_retries=1)
    with pytest.raises(AgentHTTPError, match=r"answered 500, through .*: RuntimeError\('engine step failed"):
        run_once(client, make_row())
    assert len(agent.bodies) == 2


def run_group_once(client: GymClient, row: dict[str, Any]) -> list[Trajectory]:
    async def main() -> list[Trajectory]:
        async with client:
            return await client.run_group(row, num_generations=1, group_id=0, policy_version=0)

    return asyncio.run(main())


def test_a_rollout_cut_by_the_agents_step_limit_is_truncated(agent: ScriptedAgent) -> None:
    agent.script = ["cut"]
    # The head config says max_steps: 1, and the rollout ends on the output of its one model call's tool call.
    assert run_group_once(make_client(agent, head=True), make_row())[0].truncated is True
    # Given agent URLs directly, the agent's config (hence its limit) is unknown: nothing marks the cut.
    assert run_group_once(make_client(agent), make_row())[0].truncated is False
    agent.script = ["ok"]  # the canned rollout ends on a final answer: not cut
    assert run_group_once(make_client(agent, head=True), make_row())[0].truncated is False


def test_step_limits_come_from_the_agents_config() -> None:
    agent = {"host": "h", "port": 1, "max_steps": 4}
    config = {
        "a": {"responses_api_agents": {"simple_agent": agent}},
        "b": {"responses_api_agents": {"simple_agent": agent | {"max_steps": 2, "count_tool_calls": True}}},
        "c": {"responses_api_agents": {"simple_agent": agent | {"max_steps": None}}},
    }
    assert agent_step_limits_from_config(config) == {"a": StepLimit(4), "b": StepLimit(2, counts_tool_calls=True)}


def test_rows_without_an_agent_go_to_the_default_agent(agent: ScriptedAgent) -> None:
    row = make_row()
    del row["agent_ref"]
    client = make_client(agent, agent_names=("math_agent", "synonym_agent"), default_agent="synonym_agent")
    assert run_once(client, row) == CANNED_RESULT


def test_a_row_without_an_agent_among_several_and_no_default_names_the_row(agent: ScriptedAgent) -> None:
    row = make_row()
    del row["agent_ref"]
    client = make_client(agent, agent_names=("math_agent", "synonym_agent"))
    with pytest.raises(ValueError, match=r"row 3 has no agent_ref.name .*env.gym.default_agent"):
        run_once(client, row)


def test_an_unknown_default_agent_is_a_value_error(agent: ScriptedAgent) -> None:
    client = make_client(agent, default_agent="math_agent")
    with pytest.raises(ValueError, match=r"env.gym.default_agent\) 'math_agent' is not a known agent"):
        run_once(client, make_row())


def knob_client(agent: ScriptedAgent, **knobs: Any) -> GymClient:
    """make_client's client with the env.gym text knobs (invalid_tool_call_patterns, effort) given."""
    return GymClient(
        {"synonym_agent": f"http://127.0.0.1:{agent.port}"},
        None,
        max_concurrency=4,
        rollout_deadline_s=5.0,
        max_retries=0,
        backoff_s=0.01,
        train_sampling=SamplingProfile(temperature=1.0, top_p=1.0),
        validation_sampling=SamplingProfile(temperature=0.6, top_p=0.95),
        max_output_tokens=8,
        **knobs,
    )


def test_reasoning_effort_reaches_the_request_body_of_rows_without_their_own(agent: ScriptedAgent) -> None:
    client = knob_client(agent, reasoning_effort="high", effort_levels=["low", "high"])
    run_once(client, make_row())
    assert agent.bodies[0]["responses_create_params"]["reasoning"] == {"effort": "high"}
    own = make_row()
    own["responses_create_params"]["reasoning"] = {"effort": "low", "summary": "auto"}
    run_once(knob_client(agent, reasoning_effort="high", effort_levels=["low", "high"]), own)
    assert agent.bodies[1]["responses_create_params"]["reasoning"] == {"effort": "low", "summary": "auto"}
    run_once(knob_client(agent), make_row())  # no reasoning_effort: nothing added
    assert "reasoning" not in agent.bodies[2]["responses_create_params"]


def test_a_row_effort_outside_the_levels_is_an_error_naming_the_key(agent: ScriptedAgent) -> None:
    row = make_row()
    row["responses_create_params"]["reasoning"] = {"effort": "extreme"}
    with pytest.raises(ValueError, match=r"reasoning.effort 'extreme' is not one of env.gym.effort_levels"):
        run_once(knob_client(agent, effort_levels=["low", "high"]), row)
    assert agent.bodies == []
    with pytest.raises(ValueError, match="reasoning_effort 'max' is not one of"):
        knob_client(agent, reasoning_effort="max", effort_levels=["low"])


@pytest.mark.parametrize(("patterns", "flagged"), [([r"<tool_call>"], False), ([r"^7\d1$"], True), ([], False)])
def test_invalid_tool_call_patterns_flag_trajectories_by_their_assistant_text(
    agent: ScriptedAgent, patterns: list[str], flagged: bool
) -> None:
    # The canned result's assistant message says "711"; its executed call is a function_call item, not text.
    client = knob_client(agent, invalid_tool_call_patterns=patterns)
    [trajectory] = run_group_once(client, make_row())
    assert trajectory.invalid_tool_call is flagged
