"""The built-in head server (docs/gym-protocol.md, Head server): the address book GymClient reads to find agents.

`servers/launch.py` builds the config with `gym_config` and serves it; `GET /global_config_dict_yaml` answers a
JSON string holding the YAML text, which `gym/client.py` `agent_urls_from_config` parses. With `api_key` set,
every route but GET /health requires it (the config lists where every agent listens).
"""

from collections.abc import Mapping
from typing import Any

import yaml
from fastapi import FastAPI

from asyncppo.gym.auth import require_api_key

POLICY_MODEL_NAME = "policy_model"
"""Instance name of the policy model in the config (Gym's convention)."""


def gym_config(
    head: tuple[str, int],
    resources: Mapping[str, tuple[str, int]],
    agents: Mapping[str, tuple[str, str, int]],
    model_base_url: str | list[str],
    max_steps: int,
) -> dict[str, Any]:
    """A resolved gym config: `resources` maps resources name -> (host, port), `agents` maps agent instance
    name -> (resources name, host, port). Instances are 3-level blocks `name.<server type>.<implementation>`;
    every agent block carries `max_steps`, as a NeMo-Gym simple_agent's does (GymClient reads its step limit)."""
    config: dict[str, Any] = {"head_server": {"host": head[0], "port": head[1]}}
    config[POLICY_MODEL_NAME] = {"responses_api_models": {"policy_server": {"base_url": model_base_url}}}
    for name, (host, port) in resources.items():
        config[resources_instance_name(name)] = {
            "resources_servers": {name: {"host": host, "port": port, "domain": name, "entrypoint": "builtin"}}
        }
    for agent_name, (resources_name, host, port) in agents.items():
        agent = {"host": host, "port": port, "entrypoint": "builtin", "max_steps": max_steps}
        agent["resources_server"] = {"type": "resources_servers", "name": resources_instance_name(resources_name)}
        agent["model_server"] = {"type": "responses_api_models", "name": POLICY_MODEL_NAME}
        config[agent_name] = {"responses_api_agents": {"simple_agent": agent}}
    return config


def resources_instance_name(resources_name: str) -> str:
    return f"{resources_name}_resources_server"


def create_head_app(config: Mapping[str, Any], api_key: str | None = None) -> FastAPI:
    """Serves `config` as it is at request time (the launcher fills in the head's own port after binding it);
    `api_key` (when set) is required as `Authorization: Bearer <key>` on every route but GET /health."""
    app = FastAPI(title="asyncppo gym head server")
    require_api_key(app, api_key)

    @app.get("/")
    async def root() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/health")
    async def health() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/global_config_dict_yaml")
    async def global_config_dict_yaml() -> str:
        return yaml.safe_dump(dict(config), sort_keys=False)

    return app
