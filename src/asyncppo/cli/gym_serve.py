"""`asyncppo gym serve CONFIG`: the policy server over an in-process engine plus the built-in gym, until a signal.

For trying a model, an environment or a client by hand with the trainer's own servers; nothing is trained.
Called by `cli/main.py`; reads the run config's model, generation, env.gym and cluster.device sections:

    load_policy --> HFGenerator --> PolicyServer 127.0.0.1:env.gym.policy_server_port
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

from asyncppo.cli import builders
from asyncppo.config import ConfigError, RunConfig, load_config
from asyncppo.generation.hf_generator import HFGenerator
from asyncppo.generation.protocol import SamplingParams
from asyncppo.gym.policy_server import PolicyServer, SamplingProfile, create_policy_app
from asyncppo.gym.servers.launch import BuiltinGym, launch_builtin_gym
from asyncppo.gym.servers.resources import RESOURCES_APPS
from asyncppo.models.policy import load_policy
from asyncppo.models.tokenizer import load_tokenizer

HOST = "127.0.0.1"
READY = "ready"
"""Printed (and flushed) once every server answers, so scripts can wait for it."""


def run_gym_serve_command(args: argparse.Namespace) -> int:
    """Start everything, serve until SIGINT or SIGTERM, stop everything; 0 on a clean stop."""
    stop_requested = threading.Event()
    with _stop_on_signals(stop_requested):
        config = load_config(args.config, args.overrides)
        _check_resources(config)
        with contextlib.ExitStack() as running:  # unwinds in reverse: gym, policy server, engine
            server = _start_policy_server(config, running)
            gym = launch_builtin_gym(
                server.url,
                resources=config.env.gym.resources,
                max_steps=config.env.gym.max_steps,
                model_name=config.env.gym.model_name,
                api_key=config.env.gym.api_key,
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


def _check_resources(config: RunConfig) -> None:
    unknown = [name for name in config.env.gym.resources if name not in RESOURCES_APPS]
    if unknown:
        known = sorted(RESOURCES_APPS)
        raise ConfigError([f"env.gym.resources: unknown built-in environment {unknown[0]!r}; expected one of {known}"])


def _start_policy_server(config: RunConfig, running: contextlib.ExitStack) -> PolicyServer:
    """Load the policy, start its engine and serve it; `running` stops both when it unwinds."""
    paths = builders.model_paths(config)
    device = builders.resolve_device(config)
    tokenizer = load_tokenizer(paths.tokenizer)
    eos_id, pad_id = tokenizer.eos_token_id, tokenizer.pad_token_id
    if not isinstance(eos_id, int):
        raise ConfigError([f"model.tokenizer: the tokenizer at {paths.tokenizer} has no single eos_token_id"])
    pad_id = pad_id if isinstance(pad_id, int) else eos_id
    stop_ids: list[int] = list(config.generation.stop_token_ids or [])
    eos: tuple[int, ...] = tuple(sorted({eos_id, *stop_ids}))
    engine = builders.engine_settings(config, eos, pad_id)
    policy = load_policy(paths.policy, dtype=builders.DTYPES[config.model.precision], device=device)
    generator = HFGenerator(
        policy,
        engine.eos_token_ids,
        engine.pad_token_id,
        engine.max_batch_size,
        device,
        seed=engine.seed,
        max_context_length=engine.max_context_length,
    )
    running.callback(generator.close)
    app = create_policy_app(
        generator,
        tokenizer,
        model_name=config.env.gym.model_name,
        train_sampling=_profile(builders.train_sampling(config, ())),
        validation_sampling=_profile(builders.validation_sampling(config, ())),
        max_model_len=config.model.max_total_sequence_length,
        api_key=config.env.gym.api_key,
    )
    port = config.env.gym.policy_server_port
    try:
        server = PolicyServer(app, host=HOST, port=port)
    except OSError as error:
        raise ConfigError([f"env.gym.policy_server_port: cannot listen on {HOST}:{port}: {error}"]) from error
    running.callback(server.stop)
    server.start()
    return server


def _profile(sampling: SamplingParams) -> SamplingProfile:
    """The (temperature, top_p) pair requests must send; greedy decoding is temperature 0 on the wire (stop ids
    play no part: requests cannot set them)."""
    return (0.0 if sampling.greedy else sampling.temperature, sampling.top_p)


def _print_servers(config: RunConfig, server: PolicyServer, gym: BuiltinGym) -> None:
    gym_config = config.env.gym
    print(f"policy server: {server.url} (model {gym_config.model_name!r})")
    print(f"head server: {gym.head_url}")
    for name, url in gym.agent_urls.items():
        print(f"agent {name}: {url}  (POST /run)")
    for name, url in gym.resources_urls.items():
        print(f"resources {name}: {url}")
    temperature, top_p = _profile(builders.train_sampling(config, ()))
    body = {"model": gym_config.model_name, "input": "What is 2+3?", "temperature": temperature, "top_p": top_p}
    headers = "-H 'Content-Type: application/json'"
    if gym_config.api_key is not None:
        headers += " -H 'Authorization: Bearer <env.gym.api_key>'"
    print(f"try: curl -s {server.url}/responses {headers} -d {shlex.quote(json.dumps(body))}")
    print(READY, flush=True)
