"""Training through the gym: policy servers on the generation hosts, the gym servers, and the rollout functions.

`trainer/run_inputs.py` (start_rollouts) calls `start_gym_rollouts` for gym runs (`env.should_use_nemo_gym`); before
that, `trainer/build.py` (start_run) and critic collection call `wait_for_external_gym`, before any process starts:

    launch: external: each configured URL probed --silent--> one line, a wait (env.gym.startup_timeout_s) or exit 2
    generation hosts: serve_http -> policy server URLs --(launch: builtin)--> launch_builtin_gym(head, agents, envs)
    GymRolloutRunner(head URL or agent URLs) --> train outcomes (sync source, async collector) and validation
"""

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from asyncppo.config import ConfigError, RunConfig
from asyncppo.generation.protocol import SupportsGenerate
from asyncppo.gym.reachability import GymUnreachableError, wait_until_reachable
from asyncppo.gym.request_limits import server_limits
from asyncppo.gym.runner import GroupOutcome, GymClientSettings, GymRolloutRunner, PolicyTraffic
from asyncppo.gym.servers.launch import BuiltinGym, launch_builtin_gym
from asyncppo.models.tokenizer import decode_ids
from asyncppo.pipeline.sources import GroupRolloutFn
from asyncppo.trainer.setup import RunSetup
from asyncppo.types import Trajectory
from asyncppo.workers.policy_http import PolicyServerSettings
from asyncppo.workers.ray_host import WorkerCallError

log = logging.getLogger(__name__)
Row = dict[str, Any]


class RolloutGenerators(SupportsGenerate, Protocol):
    """The generation side rollouts use: the run's GeneratorGroup, or an in-process engine (critic collect). The
    gym reaches it over HTTP; reward-function rollouts call `generate`."""

    def serve_http(self, settings: PolicyServerSettings) -> list[str]: ...

    def policy_requests_received(self) -> int: ...


def policy_server_settings(config: RunConfig, tokenizer_path: str) -> PolicyServerSettings:
    gym = config.env.gym
    return PolicyServerSettings(
        tokenizer_path=tokenizer_path,
        model_name=gym.model_name,
        train_sampling=config.generation.train_profile,
        validation_sampling=config.generation.validation_profile,
        max_model_len=config.model.max_total_sequence_length,
        api_key=gym.api_key,
        port=gym.policy_server_port,
        limits=server_limits(gym),
    )


@dataclass
class GymRollouts:
    """The running gym side of a training run; `close()` stops what it started."""

    runner: GymRolloutRunner
    builtin: BuiltinGym | None
    policy_urls: list[str]

    def rollout(self, num_generations: int) -> GroupRolloutFn:
        """The batch source's rollout (sync or async): one outcome per row, a failed group as its exception."""

        def run(rows: Sequence[dict[str, Any]], group_ids: Sequence[int]) -> list[GroupOutcome]:
            return self.runner.run_groups(rows, group_ids, num_generations, validation=False)

        return run

    def validation(self, rows: Sequence[dict[str, Any]], num_generations: int) -> tuple[list[Trajectory], int]:
        """Validation rollouts (validation sampling profile); failed groups are skipped and counted."""
        outcomes = self.runner.run_groups(rows, list(range(len(rows))), num_generations, validation=True)
        trajectories = [t for outcome in outcomes if not isinstance(outcome, Exception) for t in outcome]
        failures = [outcome for outcome in outcomes if isinstance(outcome, Exception)]
        for failure in failures[:3]:
            log.warning("validation: a prompt group failed and is skipped: %s: %s", type(failure).__name__, failure)
        return trajectories, len(failures)

    def close(self) -> None:
        try:
            self.runner.close()
        finally:
            if self.builtin is not None:
                self.builtin.stop()


def start_gym_rollouts(
    setup: RunSetup, generator: RolloutGenerators, policy_version: Callable[[], int], results_log: Path | None
) -> GymRollouts:
    """Serve every generation host over HTTP, start the built-in gym (launch: builtin) and connect the client."""
    config, tokenizer = setup.config, setup.tokenizer
    gym = config.env.gym
    settings = policy_server_settings(config, str(setup.paths.tokenizer))
    urls = generator.serve_http(settings)
    builtin = None
    if gym.launch == "builtin":
        builtin = launch_builtin_gym(
            urls,
            resources=gym.resources,
            max_steps=gym.max_steps,
            model_name=gym.model_name,
            api_key=gym.api_key,
            limits=server_limits(gym),
        )
    client_settings = GymClientSettings(
        # Built-in agents are found through their head server too: the same lookup as against an external gym.
        agent_urls=None if builtin is not None else (dict(gym.agent_urls) or None),
        head_server_url=builtin.head_url if builtin is not None else gym.head_server_url,
        limits=gym,
        train_sampling=config.generation.train_profile,
        validation_sampling=config.generation.validation_profile,
        max_output_tokens=config.generation.max_new_tokens,
    )

    def decode(token_ids: Sequence[int]) -> str:
        return decode_ids(tokenizer, token_ids, skip_special_tokens=False)

    try:
        runner = GymRolloutRunner(
            client_settings,
            penalties=config.reward_penalties,
            decode=decode,
            policy_version=policy_version,
            results_log=results_log,
            # An external gym is pointed at the policy servers by hand: a deadline miss then says whether it called.
            policy_traffic=PolicyTraffic(urls, lambda: _requests_received(generator)) if builtin is None else None,
        )
        try:
            print(f"gym: policy servers {urls}; agents {runner.agent_urls()}", flush=True)
        except BaseException:
            runner.close()
            raise
    except BaseException:
        if builtin is not None:
            builtin.stop()
        raise
    return GymRollouts(runner=runner, builtin=builtin, policy_urls=urls)


def _requests_received(generator: RolloutGenerators) -> int | None:
    """The policy servers' request count; None (with a warning) when a generation host does not answer."""
    try:
        return generator.policy_requests_received()
    except WorkerCallError as error:  # only a diagnostic: the rollouts' own failures say what went wrong
        log.warning("the policy servers' request count could not be read: %s", error)
        return None


STARTUP_TIMEOUT_KEY = "env.gym.startup_timeout_s"


def wait_for_external_gym(config: RunConfig) -> None:
    """launch: external: return once every configured gym URL (env.gym.head_server_url, or each of env.gym.agent_urls)
    answers an HTTP request, waiting up to env.gym.startup_timeout_s for the silent ones (one line each, then one
    when it answers); a ConfigError naming each URL still silent, and its key, after that (at once with 0)."""
    gym = config.env.gym
    if not config.env.should_use_nemo_gym or gym.launch != "external":
        return  # a built-in gym is started by the run itself, after the policy servers
    if gym.head_server_url is not None:
        urls = {"env.gym.head_server_url": gym.head_server_url}
    else:
        urls = {f"env.gym.agent_urls.{name}": url for name, url in gym.agent_urls.items()}
    try:
        wait_until_reachable(
            urls, gym.startup_timeout_s, timeout_key=STARTUP_TIMEOUT_KEY, say=lambda line: print(line, flush=True)
        )
    except GymUnreachableError as error:
        waited = (
            f"({STARTUP_TIMEOUT_KEY}=0: no wait)"
            if gym.startup_timeout_s == 0
            else f"after {error.waited_s:.0f} s ({STARTUP_TIMEOUT_KEY}={gym.startup_timeout_s:g})"
        )
        raise ConfigError(
            [
                f"{url.key}: {url.url!r} is not an http:// or https:// URL ({url.reason}); fix it"
                if url.malformed
                else f"{url.key}: {url.url} does not answer ({url.reason}) {waited}; start the gym servers first, or "
                "fix the URL"
                for url in error.silent
            ]
        ) from None
