"""`asyncppo gym serve CONFIG`: the policy server over an in-process engine plus the built-in gym, until a signal.

For trying a model, an environment or a client by hand with the trainer's own servers; nothing is trained.
Called by `cli/main.py`; reads the run config's model, generation, env.gym and cluster.device sections:

    load_policy --> engine (generation.backend) --> PolicyServer 127.0.0.1:env.gym.policy_server_port
                                      (POST /v1/chat/completions, POST /v1/responses, POST /tokenize)
    launch_builtin_gym(policy URL) --> head server, <env>_simple_agent (POST /run), <env> resources servers
    print one line per server, then `ready` --> SIGINT / SIGTERM --> stop gym, policy server, engine; exit 0
"""

import argparse
import contextlib
import json
import shlex
import signal
import threading
from collections.abc import Iterator
from types import FrameType

from asyncppo.config import ConfigError, RunConfig, load_config
from asyncppo.generation.engines import build_engine
from asyncppo.gym.policy_server_runner import PolicyServer
from asyncppo.gym.request_limits import server_limits
from asyncppo.gym.servers.launch import BuiltinGym, launch_builtin_gym
from asyncppo.models.policy import load_policy
from asyncppo.trainer.gym_setup import policy_server_settings
from asyncppo.trainer.setup import RunSetup, check_builtin_resources, resolve_setup
from asyncppo.workers.policy_http import HOST, start_policy_server

READY = "ready"
"""Printed (and flushed) once every server answers, so scripts can wait for it."""


def run_gym_serve_command(args: argparse.Namespace) -> int:
    """Start everything, serve until SIGINT or SIGTERM, stop everything; 0 on a clean stop."""
    stop_requested = threading.Event()
    with _stop_on_signals(stop_requested):
        config = load_config(args.config, args.overrides)
        check_builtin_resources(config.env.gym.resources)  # whatever env.should_use_nemo_gym says: it serves them
        setup = resolve_setup(config)
        with contextlib.ExitStack() as running:  # unwinds in reverse: gym, policy server, engine
            server = _start_policy_server(setup, running)
            gym = launch_builtin_gym(
                server.url,
                resources=config.env.gym.resources,
                max_steps=config.env.gym.max_steps,
                model_name=config.env.gym.model_name,
                api_key=config.env.gym.api_key,
                limits=server_limits(config.env.gym),
            )
            running.callback(gym.stop)
            _print_servers(config, server, gym)
            while not stop_requested.wait(0.5):  # a timed wait: signal handlers run between the waits
                pass
            print("stopping", flush=True)
    return 0


@contextlib.contextmanager
def _stop_on_signals(stop_requested: threading.Event) -> Iterator[None]:
    """SIGINT and SIGTERM set `stop_requested` instead of killing the process; the old handlers come back after."""

    def request_stop(signum: int, _: FrameType | None) -> None:
        stop_requested.set()

    previous = {signum: signal.signal(signum, request_stop) for signum in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def _start_policy_server(setup: RunSetup, running: contextlib.ExitStack) -> PolicyServer:
    """Load the policy, start its engine and serve it; `running` stops both when it unwinds."""
    policy = load_policy(setup.paths.policy, dtype=setup.dtype, device=setup.device)
    generator = build_engine(policy, setup.engine)
    running.callback(generator.close)
    settings = policy_server_settings(setup.config, str(setup.paths.tokenizer))
    try:
        server = start_policy_server(generator, settings, rank=0, tokenizer=setup.tokenizer)
    except OSError as error:
        raise ConfigError([f"env.gym.policy_server_port: cannot listen on {HOST}:{settings.port}: {error}"]) from error
    running.callback(server.stop)
    return server


def _print_servers(config: RunConfig, server: PolicyServer, gym: BuiltinGym) -> None:
    gym_config = config.env.gym
    print(f"policy server: {server.url} (model {gym_config.model_name!r})")
    print(f"head server: {gym.head_url}")
    keyed = " with Authorization: Bearer <env.gym.api_key>" if gym_config.api_key is not None else ""
    for name, url in gym.agent_urls.items():
        print(f"agent {name}: {url}  (POST /run{keyed})")
    for name, url in gym.resources_urls.items():
        print(f"resources {name}: {url}")
    train = config.generation.train_profile
    body = {"model": gym_config.model_name, "input": "What is 2+3?", "temperature": train.temperature}
    body["top_p"] = train.top_p
    headers = "-H 'Content-Type: application/json'"
    if gym_config.api_key is not None:
        headers += " -H 'Authorization: Bearer <env.gym.api_key>'"
    print(f"try: curl -s {server.url}/responses {headers} -d {shlex.quote(json.dumps(body))}")
    print(READY, flush=True)
