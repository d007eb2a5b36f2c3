"""Starts the built-in gym in this process: one resources server and one simple agent per environment, plus a head.

Called by tests and demos that point GymClient at `head_url` (or at `agent_urls` directly). Every server is a
uvicorn thread on a free 127.0.0.1 port (the PolicyServer runner, which works for any FastAPI app).

    GymClient --GET config--> head --> {<env>_simple_agent: url}
    GymClient --POST /run--> <env>_simple_agent --> <env> resources server, policy server at model_base_url

With `api_key` set, every server requires it on every route but GET /health, as the policy server does; without
it, the launch prints one warning line. Every server runs under the same `ServerLimits` as the policy server.
"""

from collections.abc import Iterable, Sequence

from asyncppo.gym.auth import warn_if_unauthenticated
from asyncppo.gym.policy_server_runner import PolicyServer
from asyncppo.gym.request_limits import DEFAULT_LIMITS, ServerLimits
from asyncppo.gym.servers.agent import create_simple_agent_app
from asyncppo.gym.servers.head import create_head_app, gym_config
from asyncppo.gym.servers.resources import create_resources_app

HOST = "127.0.0.1"


def agent_instance_name(resources_name: str) -> str:
    """The agent instance a row names in `agent_ref.name` to play in the `resources_name` environment."""
    return f"{resources_name}_simple_agent"


class BuiltinGym:
    """Running built-in gym servers; `stop()` (or leaving the `with` block) shuts all of them down."""

    def __init__(self, head: PolicyServer, agents: dict[str, PolicyServer], resources: dict[str, PolicyServer]) -> None:
        self._head = head
        self._agents = agents
        self._resources = resources

    @property
    def head_url(self) -> str:
        return _root_url(self._head)

    @property
    def agent_urls(self) -> dict[str, str]:
        """Agent instance name -> base URL."""
        return {name: _root_url(server) for name, server in self._agents.items()}

    @property
    def resources_urls(self) -> dict[str, str]:
        """Resources server name -> base URL."""
        return {name: _root_url(server) for name, server in self._resources.items()}

    def stop(self) -> None:
        """Stop the head first (no new lookups), then the agents (in-flight rollouts finish), then the resources."""
        _stop_all([self._head, *self._agents.values(), *self._resources.values()])

    def __enter__(self) -> "BuiltinGym":
        return self

    def __exit__(self, *_: object) -> None:
        self.stop()


def launch_builtin_gym(
    model_base_url: str | Sequence[str],
    *,
    resources: Sequence[str] = ("math",),
    max_steps: int,
    model_name: str = "policy",
    api_key: str | None = None,
    limits: ServerLimits = DEFAULT_LIMITS,
) -> BuiltinGym:
    """Start head, agents and resources servers; returns once all answer /health.

    `model_base_url` is the policy server's OpenAI base URL (`http://host:port/v1`) or root, or a list of them
    (one per generator worker; agents spread rollouts over them); `resources` names
    built-in environments (see `resources.RESOURCES_APPS`), one agent each, named by `agent_instance_name`.
    `api_key` (env.gym.api_key): the bearer key the policy server checks; head, agents and resources servers
    require it too, and the agents send it on. `limits`: body cap and request deadline of every server.
    """
    if not resources or len(set(resources)) != len(resources):
        raise ValueError(f"resources must name distinct built-in environments, got {list(resources)}")
    if max_steps < 1:
        raise ValueError(f"max_steps must be >= 1, got {max_steps}")
    # Sockets are bound at construction, so every port is known before any app (the head's config) is built.
    resources_servers = {
        name: PolicyServer(create_resources_app(name, api_key), host=HOST, limits=limits) for name in resources
    }
    agents = {
        agent_instance_name(name): PolicyServer(
            create_simple_agent_app(
                model_base_url, _root_url(server), model_name=model_name, max_steps=max_steps, api_key=api_key
            ),
            host=HOST,
            limits=limits,
        )
        for name, server in resources_servers.items()
    }
    config = gym_config(
        head=(HOST, 0),
        resources={name: (HOST, server.port) for name, server in resources_servers.items()},
        agents={agent_instance_name(name): (name, HOST, agents[agent_instance_name(name)].port) for name in resources},
        model_base_url=model_base_url if isinstance(model_base_url, str) else list(model_base_url),
        max_steps=max_steps,
    )
    head = PolicyServer(create_head_app(config, api_key), host=HOST, limits=limits)
    config["head_server"]["port"] = head.port  # known only once the head's socket is bound
    gym = BuiltinGym(head, agents, resources_servers)
    try:
        for server in [*resources_servers.values(), *agents.values(), head]:
            server.start()
    except RuntimeError:
        gym.stop()  # stopping a server that never started just releases its port
        raise
    environments = ", ".join(resources)
    warn_if_unauthenticated(
        api_key, f"the built-in gym servers (head {gym.head_url}, agents and resources: {environments})"
    )
    return gym


def _root_url(server: PolicyServer) -> str:
    return server.url.removesuffix("/v1")


def _stop_all(servers: Iterable[PolicyServer]) -> None:
    """Stop every server even when one fails to stop; the first failure is raised afterwards."""
    failures: list[RuntimeError] = []
    for server in servers:
        try:
            server.stop()
        except RuntimeError as error:  # a stuck server must not keep the others' ports bound
            failures.append(error)
    if failures:
        raise failures[0]
