"""GymRolloutRunner: blocking, thread-safe gym rollouts of prompt groups for the batch sources and validation.

The trainer's batch sources are synchronous and call from several threads (the sync driver; the async
collector's one thread per group), while GymClient is asyncio. The runner owns one event loop thread with one
GymClient, so every caller shares its connection pool and its concurrency bound:

    caller thread: run_groups(rows, group_ids) --run_coroutine_threadsafe--> loop thread: GymClient.run_group x N
                   <-- one outcome per row: its Trajectories (reward penalties applied), or the Exception

A group's failure is returned as a value, not raised: the sources replace failed groups within a budget. With
`PolicyTraffic`, a rollout that missed its deadline while no request reached the run's policy servers says so, with
their addresses (an external gym whose model server calls another port would otherwise only time out, unexplained).
"""

import asyncio
import json
import threading
import time
from collections import Counter
from collections.abc import Callable, Coroutine, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from asyncppo.config.runtime import GymConfig, RewardPenaltiesConfig
from asyncppo.gym.client import GymClient, RolloutDeadlineError
from asyncppo.gym.results import InvalidResultError
from asyncppo.rollout.penalties import apply_reward_penalties
from asyncppo.types import SamplingProfile, Trajectory

T = TypeVar("T")
# Seconds close() waits for the loop thread to finish the client's shutdown.
CLOSE_TIMEOUT_S = 10.0
# Seconds a reading of the policy servers' request count serves as the count before a later call's rollouts: an older
# reading only widens the window in which no request arrived, so the claim stays true.
TRAFFIC_READING_REUSE_S = 5.0


@dataclass(frozen=True)
class GymClientSettings:
    """Everything GymClient is built from: the `env.gym` section's limits, and where the agents are resolved to
    (`trainer/gym_setup.py` points built-in runs at the head server it started)."""

    agent_urls: Mapping[str, str] | None
    head_server_url: str | None
    limits: GymConfig
    """Read for max_concurrency, rollout_deadline_s, max_retries, backoff_s, api_key, default_agent, the
    invalid_tool_call_patterns, reasoning_effort and effort_levels (the client) and thinking_tags (the penalties)."""
    train_sampling: SamplingProfile
    validation_sampling: SamplingProfile
    max_output_tokens: int


GroupOutcome = list[Trajectory] | Exception


@dataclass(frozen=True)
class PolicyTraffic:
    """The run's policy servers as the gym must call them, and a count of the requests they have received."""

    urls: Sequence[str]
    """Their OpenAI base URLs (`http://127.0.0.1:PORT/v1`), one per generation host."""
    requests_received: Callable[[], int | None]
    """HTTP requests they have received so far, summed; None when it cannot be read now."""


class PolicyServerNotCalledError(RolloutDeadlineError):
    """A rollout missed its deadline and no request reached any of the run's policy servers meanwhile: the gym's
    model server calls some other address (or none)."""


class GymRolloutRunner:
    """Runs prompt groups through gym agents from any thread; `close()` ends the loop thread and the client."""

    def __init__(
        self,
        settings: GymClientSettings,
        *,
        penalties: RewardPenaltiesConfig,
        decode: Callable[[Sequence[int]], str],
        policy_version: Callable[[], int],
        results_log: Path | None = None,
        policy_traffic: PolicyTraffic | None = None,
    ) -> None:
        """`policy_version()` is the weight version the generators hold now (stamped on each trajectory);
        `results_log`: append every raw `/run` result there as one JSON line (env.should_log_nemo_gym_responses);
        `policy_traffic`: the policy servers, whose request count tells a deadline miss the gym never called them in
        (PolicyServerNotCalledError) from one that was only slow."""
        self._traffic = policy_traffic
        self._traffic_lock = threading.Lock()
        self._traffic_reading: tuple[float, int] | None = None  # (monotonic time, count) of the last reading
        self._results_log = results_log.open("a", encoding="utf-8") if results_log is not None else None
        self._log_lock = threading.Lock()
        self._penalties = penalties
        self._thinking_tags = settings.limits.thinking_tags
        self._counts_invalid_tool_calls = bool(settings.limits.invalid_tool_call_patterns)
        self._decode = decode
        self._policy_version = policy_version
        self._counters: Counter[str] = Counter()
        self._counter_lock = threading.Lock()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="gym-rollouts", daemon=True)
        self._thread.start()
        self._client = self._call(self._make_client(settings))

    @staticmethod
    async def _make_client(settings: GymClientSettings) -> GymClient:
        # Built on the loop thread: httpx's async client belongs to the loop that first uses it.
        return GymClient(
            settings.agent_urls,
            settings.head_server_url,
            max_concurrency=settings.limits.max_concurrency,
            rollout_deadline_s=settings.limits.rollout_deadline_s,
            max_retries=settings.limits.max_retries,
            backoff_s=settings.limits.backoff_s,
            train_sampling=settings.train_sampling,
            validation_sampling=settings.validation_sampling,
            max_output_tokens=settings.max_output_tokens,
            api_key=settings.limits.api_key,
            default_agent=settings.limits.default_agent,
            invalid_tool_call_patterns=settings.limits.invalid_tool_call_patterns,
            reasoning_effort=settings.limits.reasoning_effort,
            effort_levels=settings.limits.effort_levels,
        )

    def _call(self, coroutine: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop).result()

    def agent_urls(self) -> dict[str, str]:
        """Agent name -> URL (looked up on the head server on first use); fails fast when the gym is unreachable."""
        return self._call(self._client.agent_urls())

    def run_groups(
        self, rows: Sequence[Mapping[str, Any]], group_ids: Sequence[int], num_generations: int, validation: bool
    ) -> list[GroupOutcome]:
        """Every row's group of `num_generations` rollouts, run concurrently; one outcome per row, in order."""
        if len(rows) != len(group_ids):
            raise ValueError(f"run_groups: {len(rows)} rows but {len(group_ids)} group ids")
        received_before = self._requests_received(reuse=True)
        outcomes = self._call(self._run_groups(rows, group_ids, num_generations, validation))
        if received_before is None or not any(isinstance(outcome, RolloutDeadlineError) for outcome in outcomes):
            return outcomes
        if self._requests_received(reuse=False) != received_before:
            return outcomes  # the gym did call the policy servers: these rollouts were only slow
        return [
            self._not_called(outcome) if isinstance(outcome, RolloutDeadlineError) else outcome for outcome in outcomes
        ]

    def _requests_received(self, *, reuse: bool) -> int | None:
        """The policy servers' request count: a fresh reading, or with `reuse` one up to TRAFFIC_READING_REUSE_S old
        (a reading costs a call into every generation host)."""
        if self._traffic is None:
            return None
        with self._traffic_lock:
            reading = self._traffic_reading
        now = time.monotonic()
        if reuse and reading is not None and now - reading[0] <= TRAFFIC_READING_REUSE_S:
            return reading[1]
        count = self._traffic.requests_received()
        if count is not None:
            with self._traffic_lock:
                self._traffic_reading = (now, count)
        return count

    def _not_called(self, error: RolloutDeadlineError) -> PolicyServerNotCalledError:
        assert self._traffic is not None
        urls = list(self._traffic.urls)
        servers = f"the policy server {urls[0]}" if len(urls) == 1 else f"the policy servers {', '.join(urls)}"
        self._count("policy_server_not_called")
        failure = PolicyServerNotCalledError(
            f"{error}; no request reached {servers} while it ran: the gym's model server must call that address "
            "(env.gym.policy_server_port fixes the port; 0 picks a free one each run)"
        )
        failure.__cause__ = error
        return failure

    async def _run_groups(
        self, rows: Sequence[Mapping[str, Any]], group_ids: Sequence[int], num_generations: int, validation: bool
    ) -> list[GroupOutcome]:
        version = self._policy_version()
        tasks = [
            self._client.run_group(
                row, num_generations, group_id, version, validation=validation, result_sink=self._sink(group_id)
            )
            for row, group_id in zip(rows, group_ids, strict=True)
        ]
        # return_exceptions: one group's failure must not cancel the others (each is replaced on its own).
        results = await asyncio.gather(*tasks, return_exceptions=True)
        outcomes: list[GroupOutcome] = []
        for result in results:
            if isinstance(result, BaseException) and not isinstance(result, Exception):
                raise result  # cancellation or interpreter exit: not a rollout failure
            if isinstance(result, Exception):
                self._count("failed_groups")
                if isinstance(result, InvalidResultError):
                    self._count("invalid_results")  # the agent answered, but with a result we cannot train on
                outcomes.append(result)
                continue
            outcomes.append(self._apply_penalties(result))
        return outcomes

    def _sink(self, group_id: int) -> Callable[[int, Mapping[str, Any]], None] | None:
        if self._results_log is None:
            return None
        log = self._results_log

        def write(sample_index: int, result: Mapping[str, Any]) -> None:
            record = {"group_id": group_id, "sample_index": sample_index, "result": result}
            with self._log_lock:
                log.write(json.dumps(record, default=repr) + "\n")
                log.flush()

        return write

    def _apply_penalties(self, group: list[Trajectory]) -> list[Trajectory]:
        if self._counts_invalid_tool_calls:
            self._count("invalid_tool_calls", sum(trajectory.invalid_tool_call for trajectory in group))
        if not self._penalties.any_enabled:
            return group
        penalized, counts = apply_reward_penalties(group, self._penalties, self._decode, self._thinking_tags)
        for name, count in counts.items():
            self._count(f"penalties/{name}", count)
        return penalized

    def _count(self, name: str, amount: int = 1) -> None:
        with self._counter_lock:
            self._counters[name] += amount

    def metrics(self) -> dict[str, float]:
        """Cumulative counters since start: the client's `gym/*` (rollouts, retries, failures by kind, judge
        failures) plus `gym/failed_groups`, `gym/invalid_results` (failed groups whose agent answered with an
        unusable result: non-finite reward or logprob, missing or mistyped field), `gym/invalid_tool_calls` (rollouts
        flagged by env.gym.invalid_tool_call_patterns, when it lists any), `gym/penalties/<name>` and
        `gym/policy_server_not_called` (deadline misses while no request reached the policy servers)."""
        with self._counter_lock:
            own = {f"gym/{name}": float(count) for name, count in self._counters.items()}
        return {**self._client.metrics(), **own}

    def close(self) -> None:
        """Close the client and stop the loop thread (idempotent)."""
        if self._results_log is not None and not self._results_log.closed:
            with self._log_lock:
                self._results_log.close()
        if not self._thread.is_alive():
            return
        try:
            asyncio.run_coroutine_threadsafe(self._client.aclose(), self._loop).result(CLOSE_TIMEOUT_S)
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(CLOSE_TIMEOUT_S)
