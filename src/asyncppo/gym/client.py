"""GymClient: runs rollouts on NeMo-Gym agent servers over HTTP (`POST /run`) and returns them as Trajectories.

Called by the rollout workers; conversion of one result lives in `gym/results.py`.

    run_group(row, G) --G tasks--> run(row) --semaphore--> [POST {agent}/run, retry on 5xx/408/429/drop,
                                                                 |  not on a policy-server 4xx wrapped in a 500]
                                                                 |  (all under one per-rollout deadline)
                       list[Trajectory] <-- trajectory_from_result(result, row=own copy, the agent's step limit)

An asyncio httpx client (not threads): a rollout spends minutes waiting on one socket, so hundreds of them
in flight cost one event loop instead of hundreds of threads, and `asyncio.timeout` gives a deadline that
also cancels the backoff sleeps. NeMo-Gym's own HTTP loops retry connection failures forever; here every retry,
wait and failure is bounded, and counted in `metrics()` (docs/gym-protocol.md, Retries, deadlines and failure
counting).
"""

import asyncio
import copy
import dataclasses
import json
import re
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import httpx
import yaml

from asyncppo.gym.auth import bearer_headers
from asyncppo.gym.error_bodies import unwrap_error_body
from asyncppo.gym.results import StepLimit, has_invalid_tool_call, quote, trajectory_from_result
from asyncppo.types import SamplingProfile, Trajectory

# Statuses (besides 5xx) after which the agent may well succeed on a rerun: infrastructure, not data.
RETRYABLE_STATUSES = frozenset({408, 429})
# Seconds a head server may take to answer the config lookup.
HEAD_SERVER_TIMEOUT_S = 30.0
# `_ng_failure_class` of a result whose LLM judge failed in /verify.
JUDGE_FAILED = "judge_failed"


class GymRolloutError(RuntimeError):
    """A `/run` call that did not produce a usable result."""


class AgentHTTPError(GymRolloutError):
    """The agent answered with an error status; `status` and the innermost error message are in the message.

    `inner_client_status` is the 4xx of the policy server (or another OpenAI-style server) when NeMo-Gym
    wrapped it in a 500 (`gym/error_bodies.py`): a failure of the request, which a rerun repeats."""

    def __init__(self, message: str, status: int, inner_client_status: int | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.inner_client_status = inner_client_status

    @property
    def is_retryable(self) -> bool:
        """Infrastructure (5xx, 408, 429) rather than a refused request, unless a wrapped 4xx says otherwise."""
        if self.inner_client_status is not None and self.inner_client_status not in RETRYABLE_STATUSES:
            return False
        return self.status >= 500 or self.status in RETRYABLE_STATUSES


class AgentConnectionError(GymRolloutError):
    """The connection to the agent failed or dropped before a complete answer."""


class MalformedResultError(GymRolloutError):
    """The agent answered 200 with a body that is not a JSON object."""


class RolloutDeadlineError(GymRolloutError, TimeoutError):
    """A rollout (retries included) ran past its deadline."""


class GymClient:
    """Sends dataset rows to gym agents and converts the results; use as an async context manager or `aclose()`."""

    def __init__(
        self,
        agent_urls: Mapping[str, str] | None,
        head_server_url: str | None,
        *,
        max_concurrency: int,
        rollout_deadline_s: float,
        max_retries: int,
        backoff_s: float,
        train_sampling: SamplingProfile,
        validation_sampling: SamplingProfile,
        max_output_tokens: int,
        api_key: str | None = None,
        default_agent: str | None = None,
        invalid_tool_call_patterns: Sequence[str] = (),
        reasoning_effort: str | None = None,
        effort_levels: Sequence[str] | None = None,
    ) -> None:
        """`api_key` (env.gym.api_key) is sent as `Authorization: Bearer <key>` to the head and the agents.
        `default_agent`: the agent of rows without `agent_ref.name` (NeMo-Gym's collector takes one the same
        way); None = the only agent, and an error naming the row when there are several.
        `invalid_tool_call_patterns` flag trajectories (`Trajectory.invalid_tool_call`, `has_invalid_tool_call`).
        `reasoning_effort` is stamped as `reasoning.effort` into rows without one; `effort_levels` (None = any)
        bounds it and every row's own value."""
        if (agent_urls is None) == (head_server_url is None):
            raise ValueError("GymClient: give exactly one of agent_urls and head_server_url")
        if max_concurrency < 1 or rollout_deadline_s <= 0 or max_retries < 0 or backoff_s < 0 or max_output_tokens < 1:
            raise ValueError(
                f"GymClient: need max_concurrency >= 1 (got {max_concurrency}), rollout_deadline_s > 0 "
                f"({rollout_deadline_s}), max_retries >= 0 ({max_retries}), backoff_s >= 0 ({backoff_s}) and "
                f"max_output_tokens >= 1 ({max_output_tokens})"
            )
        self._agent_urls = {name: url.rstrip("/") for name, url in agent_urls.items()} if agent_urls else None
        self._head_server_url = head_server_url.rstrip("/") if head_server_url else None
        self._default_agent = default_agent
        # Agent name -> its cap on one rollout, from the gym config (unknown when agent_urls are given directly).
        self._step_limits: dict[str, StepLimit] = {}
        self._rollout_deadline_s = rollout_deadline_s
        self._max_retries = max_retries
        self._backoff_s = backoff_s
        self._train_sampling = train_sampling
        self._validation_sampling = validation_sampling
        self._max_output_tokens = max_output_tokens
        self._invalid_tool_call_patterns = [re.compile(pattern) for pattern in invalid_tool_call_patterns]
        self._effort_levels = list(effort_levels) if effort_levels is not None else None
        if (
            reasoning_effort is not None
            and self._effort_levels is not None
            and reasoning_effort not in self._effort_levels
        ):
            raise ValueError(f"GymClient: reasoning_effort {reasoning_effort!r} is not one of {self._effort_levels}")
        self._reasoning_effort = reasoning_effort
        self._semaphore = asyncio.Semaphore(max_concurrency)
        self._resolve_lock = asyncio.Lock()
        # No transport timeout: a rollout legitimately holds one request for minutes; the deadline bounds it.
        self._http = httpx.AsyncClient(
            timeout=None, limits=httpx.Limits(max_connections=max_concurrency), headers=bearer_headers(api_key)
        )
        self._counters: Counter[str] = Counter()

    async def __aenter__(self) -> "GymClient":
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self._http.aclose()

    def metrics(self) -> dict[str, float]:
        """Counters since construction: rollouts started/succeeded, retries, deadline misses, `failures/<kind>`
        (one per failed attempt; kinds `connection`, `http_<status>`, `malformed_json`, `deadline`) and
        `judge_failures` (results that succeeded with reward 0 because the environment's judge failed)."""
        return {f"gym/{name}": float(count) for name, count in sorted(self._counters.items())}

    async def agent_urls(self) -> dict[str, str]:
        """Agent instance name -> base URL; fetched once from the head server when not given directly.

        Raises ValueError when the default agent is not one of them."""
        async with self._resolve_lock:
            if self._agent_urls is None:
                assert self._head_server_url is not None
                self._agent_urls = await self._fetch_agent_urls(self._head_server_url)
        if self._default_agent is not None and self._default_agent not in self._agent_urls:
            raise ValueError(
                f"default agent (env.gym.default_agent) {self._default_agent!r} is not a known agent; "
                f"known: {sorted(self._agent_urls)}"
            )
        return dict(self._agent_urls)

    async def _fetch_agent_urls(self, head_server_url: str) -> dict[str, str]:
        url = f"{head_server_url}/global_config_dict_yaml"
        response = await self._http.get(url, timeout=HEAD_SERVER_TIMEOUT_S)
        if response.status_code != 200:
            raise AgentHTTPError(
                f"GET {url} answered {response.status_code}: {quote(response.text)}", response.status_code
            )
        # The body is a JSON string whose value is the YAML text of the resolved gym config.
        try:
            config = yaml.safe_load(json.loads(response.text))
        except (json.JSONDecodeError, TypeError, yaml.YAMLError) as error:
            raise MalformedResultError(
                f"GET {url}: not a JSON string of YAML ({error}): {quote(response.text)}"
            ) from None
        urls = agent_urls_from_config(config)
        if not urls:
            raise ValueError(f"GET {url}: the gym config lists no responses_api_agents instance")
        self._step_limits = agent_step_limits_from_config(config)
        return urls

    async def run(self, row: Mapping[str, Any], *, validation: bool = False) -> dict[str, Any]:
        """POST one rollout of `row` to its agent (`row.agent_ref.name`, else the default) and return the result JSON.

        The caller's row is not modified: a deep copy is stamped with the sampling profile and
        `max_output_tokens = min(row's, client's)`. The deadline starts once a concurrency slot is free.
        """
        body = self._request_body(row, validation)
        agent_name, agent_url = await self._agent_for(row)
        self._counters["rollouts_started"] += 1
        async with self._semaphore:
            start = time.monotonic()
            try:
                async with asyncio.timeout(self._rollout_deadline_s):
                    result = await self._run_with_retries(agent_url, body)
            except TimeoutError:
                self._counters["deadline_misses"] += 1
                self._counters["failures/deadline"] += 1
                row_index = row.get("_rowidx")
                row_text = f" row {row_index}" if row_index is not None else ""
                raise RolloutDeadlineError(
                    f"gym agent {agent_name!r} ({agent_url}): rollout of{row_text or ' a row'} missed its deadline "
                    f"of {self._rollout_deadline_s} s (after {time.monotonic() - start:.1f} s, retries included)"
                ) from None
        self._counters["rollouts_succeeded"] += 1
        # A failed LLM judge answers 200 with reward 0 (docs/gym-protocol.md, Judge failsafe): trained as a real 0,
        # but counted.
        if result.get("_ng_failure_class") == JUDGE_FAILED:
            self._counters["judge_failures"] += 1
        return result

    async def run_group(
        self,
        row: Mapping[str, Any],
        num_generations: int,
        group_id: int,
        policy_version: int,
        *,
        validation: bool = False,
        result_sink: Callable[[int, Mapping[str, Any]], None] | None = None,
    ) -> list[Trajectory]:
        """Run `num_generations` rollouts of one row concurrently; one Trajectory each, in sample order.

        The first failing sample's error is raised (a group with a missing sample is useless to a baseline) and
        its siblings are cancelled. `result_sink(sample_index, result)` sees every raw result before conversion.
        """
        if num_generations < 1:
            raise ValueError(f"run_group: num_generations must be >= 1, got {num_generations}")
        # A TaskGroup (not gather) so that one failed sample cancels its siblings instead of leaving them running.
        try:
            async with asyncio.TaskGroup() as group:
                tasks = [
                    # Gym's bookkeeping fields name the task (the prompt group) and the sample within it.
                    group.create_task(
                        self.run({**row, "_ng_task_index": group_id, "_ng_rollout_index": index}, validation=validation)
                    )
                    for index in range(num_generations)
                ]
        except ExceptionGroup as failures:
            raise failures.exceptions[0] from failures
        results = [task.result() for task in tasks]
        if result_sink is not None:
            for sample_index, result in enumerate(results):
                result_sink(sample_index, result)
        agent_name, _ = await self._agent_for(row)
        step_limit = self._step_limits.get(agent_name)
        trajectories = [
            trajectory_from_result(
                result,
                row=row,
                group_id=group_id,
                sample_index=sample_index,
                policy_version=policy_version,
                step_limit=step_limit,
            )
            for sample_index, result in enumerate(results)
        ]
        if not self._invalid_tool_call_patterns:
            return trajectories
        return [
            dataclasses.replace(trajectory, invalid_tool_call=True)
            if has_invalid_tool_call(result, self._invalid_tool_call_patterns)
            else trajectory
            for trajectory, result in zip(trajectories, results, strict=True)
        ]

    def _request_body(self, row: Mapping[str, Any], validation: bool) -> dict[str, Any]:
        body = copy.deepcopy(dict(row))
        params = body.get("responses_create_params")
        if not isinstance(params, dict):
            raise ValueError(f"gym row: `responses_create_params` must be an object; row starts: {quote(row)}")
        sampling = self._validation_sampling if validation else self._train_sampling
        row_limit = params.get("max_output_tokens")
        params["temperature"] = sampling.temperature
        params["top_p"] = sampling.top_p
        params["max_output_tokens"] = min(row_limit, self._max_output_tokens) if row_limit else self._max_output_tokens
        self._stamp_effort(params, row)
        return body

    def _stamp_effort(self, params: dict[str, Any], row: Mapping[str, Any]) -> None:
        """`reasoning.effort` = the row's own, else reasoning_effort; either checked against effort_levels."""
        reasoning = params.get("reasoning") or {}
        if not isinstance(reasoning, dict):
            raise ValueError(f"gym row: `responses_create_params.reasoning` must be an object; row: {quote(row)}")
        effort = reasoning.get("effort", self._reasoning_effort)
        if effort is None:
            return
        if self._effort_levels is not None and effort not in self._effort_levels:
            raise ValueError(
                f"gym row: responses_create_params.reasoning.effort {effort!r} is not one of env.gym.effort_levels "
                f"{self._effort_levels}; row starts: {quote(row)}"
            )
        params["reasoning"] = {**reasoning, "effort": effort}

    async def _agent_for(self, row: Mapping[str, Any]) -> tuple[str, str]:
        urls = await self.agent_urls()
        agent_ref = row.get("agent_ref")
        name = agent_ref.get("name") if isinstance(agent_ref, Mapping) else None
        if name is None:
            name = self._default_agent
        if name is None:
            if len(urls) != 1:
                row_index = row.get("_rowidx")
                row_text = f"row {row_index}" if row_index is not None else f"row {quote(row)}"
                raise ValueError(
                    f"gym {row_text} has no agent_ref.name and the gym has {len(urls)} agents {sorted(urls)}: name "
                    "one in the row's agent_ref, or set env.gym.default_agent"
                )
            name = next(iter(urls))
        if name not in urls:
            raise ValueError(f"gym row: agent_ref.name {name!r} is not a known agent; known: {sorted(urls)}")
        return name, urls[name]

    async def _run_with_retries(self, agent_url: str, body: dict[str, Any]) -> dict[str, Any]:
        """Rerun the whole rollout after a retryable failure, sleeping backoff_s * 2**attempt between tries."""
        for attempt in range(self._max_retries + 1):
            try:
                return await self._post_run(agent_url, body)
            except (AgentConnectionError, AgentHTTPError) as error:
                retryable = isinstance(error, AgentConnectionError) or error.is_retryable
                if not retryable or attempt == self._max_retries:
                    raise
                self._counters["retries"] += 1
                await asyncio.sleep(self._backoff_s * 2**attempt)
        raise AssertionError("unreachable: the last attempt returns or raises")

    async def _post_run(self, agent_url: str, body: dict[str, Any]) -> dict[str, Any]:
        url = f"{agent_url}/run"
        try:
            response = await self._http.post(url, json=body)
        except httpx.TransportError as error:
            self._counters["failures/connection"] += 1
            raise AgentConnectionError(f"POST {url}: {type(error).__name__}: {error}") from error
        if response.status_code != 200:
            self._counters[f"failures/http_{response.status_code}"] += 1
            error_body = unwrap_error_body(response.text)
            inner = (
                f" (policy server {error_body.inner_client_status})"
                if error_body.inner_client_status is not None
                else ""
            )
            through = f", through {' -> '.join(error_body.hops)}" if error_body.hops else ""
            raise AgentHTTPError(
                f"POST {url} answered {response.status_code}{inner}{through}: {error_body.message}",
                response.status_code,
                error_body.inner_client_status if error_body.hops else None,
            )
        try:
            result = response.json()
        except (json.JSONDecodeError, UnicodeDecodeError) as error:
            self._counters["failures/malformed_json"] += 1
            raise MalformedResultError(f"POST {url}: body is not JSON ({error}): {quote(response.text)}") from None
        if not isinstance(result, dict):
            self._counters["failures/malformed_json"] += 1
            raise MalformedResultError(f"POST {url}: body is not a JSON object: {quote(response.text)}")
        return result


def agent_urls_from_config(config: object) -> dict[str, str]:
    """Agent instance name -> `http://host:port`, from a resolved gym config (`name.responses_api_agents.<type>`)."""
    urls: dict[str, str] = {}
    if not isinstance(config, Mapping):
        return urls
    for name, instance in config.items():
        agents = instance.get("responses_api_agents") if isinstance(instance, Mapping) else None
        if not isinstance(agents, Mapping):
            continue
        for agent_config in agents.values():
            if isinstance(agent_config, Mapping) and "host" in agent_config and "port" in agent_config:
                urls[str(name)] = f"http://{agent_config['host']}:{agent_config['port']}"
    return urls


def agent_step_limits_from_config(config: object) -> dict[str, StepLimit]:
    """Agent instance name -> its step limit, for agents whose config block sets `max_steps` (NeMo-Gym's
    simple_agent: model calls per rollout, or tool calls with `count_tool_calls: true`; null or 0 = no limit)."""
    limits: dict[str, StepLimit] = {}
    if not isinstance(config, Mapping):
        return limits
    for name, instance in config.items():
        agents = instance.get("responses_api_agents") if isinstance(instance, Mapping) else None
        if not isinstance(agents, Mapping):
            continue
        for agent_config in agents.values():
            max_steps = agent_config.get("max_steps") if isinstance(agent_config, Mapping) else None
            if isinstance(max_steps, int) and not isinstance(max_steps, bool) and max_steps > 0:
                assert isinstance(agent_config, Mapping)
                counts_tool_calls = agent_config.get("count_tool_calls") is True
                limits[str(name)] = StepLimit(max_steps, counts_tool_calls=counts_tool_calls)
    return limits
