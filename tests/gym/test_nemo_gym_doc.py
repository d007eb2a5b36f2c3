"""docs/nemo-gym.md, step by step, against asyncppo's built-in servers (they speak NeMo-Gym's protocol): the page's
asyncppo config validates and puts the policy servers where its NeMo-Gym variables point, a model call shaped as the
page shows is served with the page's key and model name, every refusal the page lists happens, the head server
lookup finds the agents, and the page's row trains with the config's sampling pairs stamped in."""

import copy
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from gym_fakes import ScriptedGenerator
from transformers import PreTrainedTokenizerBase

from asyncppo.config import RunConfig, validate_tree
from asyncppo.distributed.process_group import free_port
from asyncppo.gym.client import HEAD_SERVER_TIMEOUT_S
from asyncppo.gym.policy_server_runner import PolicyServer
from asyncppo.gym.results import InvalidResultError, trajectory_from_result
from asyncppo.gym.runner import GymClientSettings, GymRolloutRunner
from asyncppo.gym.servers.launch import launch_builtin_gym
from asyncppo.models.tiny import EOS_TOKEN_ID
from asyncppo.trainer.gym_setup import policy_server_settings
from asyncppo.workers.policy_http import start_policy_server
from ppo_settings import gae_section

DOC = (Path(__file__).parents[2] / "docs" / "nemo-gym.md").read_text()
BASE_TREE: dict[str, Any] = {
    "model": {"model_name": "tiny:tiny", "train_micro_batch_size": 2, "max_total_sequence_length": 256},
    "value": {"train_micro_batch_size": 2},
    "data": {"train_path": "unused.jsonl"},
    "generation": {"max_new_tokens": 16},
    "ppo": {
        "num_prompts_per_step": 1,
        "num_generations_per_prompt": 2,
        "max_num_steps": 1,
        "ppo_epochs": 1,
        "adv_estimator": gae_section(),
    },
}


def doc_block(language: str, first_line: str) -> str:
    """The page's fenced `language` block that starts with `first_line` (its text, fences excluded)."""
    blocks = re.findall(rf"^```{language}\n(.*?)^```", DOC, flags=re.MULTILINE | re.DOTALL)
    [block] = [block for block in blocks if block.startswith(first_line)]
    return block


ASYNCPPO_SECTIONS = yaml.safe_load(doc_block("yaml", "# asyncppo run config"))
NEMO_GYM_VARIABLES = yaml.safe_load(doc_block("yaml", "# NeMo-Gym"))
MODEL_CALL = json.loads(doc_block("json", '{"model"'))
ROW = json.loads(doc_block("json", '{"responses_create_params"'))
KEY = ASYNCPPO_SECTIONS["env"]["gym"]["api_key"]


def run_config(**gym: Any) -> RunConfig:
    """The page's sections over a minimal run, with `gym` keys replaced (a free port, the test's head server)."""
    tree = copy.deepcopy(BASE_TREE)
    tree["generation"] |= ASYNCPPO_SECTIONS["generation"]
    tree["env"] = copy.deepcopy(ASYNCPPO_SECTIONS["env"])
    tree["env"]["gym"] |= gym
    return validate_tree(tree)


def test_the_nemo_gym_variables_name_what_the_asyncppo_config_serves():
    gym = ASYNCPPO_SECTIONS["env"]["gym"]
    num_workers = ASYNCPPO_SECTIONS["generation"]["num_workers"]
    port = gym["policy_server_port"]
    expected = {
        "policy_base_url": [f"http://127.0.0.1:{port + rank}/v1" for rank in range(num_workers)],
        "policy_api_key": gym["api_key"],
        "policy_model_name": gym["model_name"],
    }
    assert expected == NEMO_GYM_VARIABLES
    config = run_config()
    assert config.env.should_use_nemo_gym and config.env.gym.launch == "external"
    assert not config.generation.colocated.enabled
    assert config.env.gym.head_server_url == gym["head_server_url"]
    assert HEAD_SERVER_TIMEOUT_S == 30


@pytest.fixture(scope="module")
def generator(tokenizer: PreTrainedTokenizerBase) -> ScriptedGenerator:
    """Answers every model call with "5" and EOS, and records the requests."""
    return ScriptedGenerator([*tokenizer.encode("5", add_special_tokens=False), EOS_TOKEN_ID])


@pytest.fixture(scope="module")
def policy_servers(
    generator: ScriptedGenerator, tokenizer: PreTrainedTokenizerBase, tiny_dir: Path
) -> Iterator[list[PolicyServer]]:
    """Generator workers 0 and 1 of the page's config, on a free port instead of 8000 (one pair for the module)."""
    settings = policy_server_settings(run_config(policy_server_port=free_port()), str(tiny_dir))
    servers = [start_policy_server(generator, settings, rank, tokenizer=tokenizer) for rank in range(2)]
    yield servers
    for server in servers:
        server.stop()


def post(url: str, body: dict, key: str | None = KEY) -> httpx.Response:
    headers = {"Authorization": f"Bearer {key}"} if key is not None else {}
    return httpx.post(url, json=body, headers=headers, timeout=30)


@pytest.mark.integration
def test_generator_worker_i_serves_the_policy_on_loopback_at_port_plus_i(policy_servers: list[PolicyServer]):
    port = policy_servers[0].port
    assert [server.url for server in policy_servers] == [f"http://127.0.0.1:{port + rank}/v1" for rank in (0, 1)]


@pytest.mark.integration
def test_a_model_call_as_nemo_gym_sends_it_is_served_with_its_token_fields(
    policy_servers: list[PolicyServer], generator: ScriptedGenerator
):
    url = policy_servers[0].url
    reply = post(f"{url}/chat/completions", MODEL_CALL)
    assert reply.status_code == 200, reply.text
    [choice] = reply.json()["choices"]
    message = choice["message"]
    assert message["content"] == "5"
    assert message["generation_token_ids"] == list(generator.token_ids)
    assert len(message["generation_log_probs"]) == len(message["generation_token_ids"])
    assert message["prompt_token_ids"] == list(generator.requests[-1].prompt_token_ids)
    root = url.removesuffix("/v1")
    assert httpx.post(f"{root}/tokenize", json={"prompt": "2 + 3"}, headers=_bearer()).status_code == 200
    assert httpx.get(f"{url}/models", headers=_bearer()).status_code == 200
    assert httpx.get(f"{url}/models").status_code == 401  # an answer all the same, for a readiness probe
    assert httpx.get(f"{root}/health").status_code == 200


def _bearer() -> dict[str, str]:
    return {"Authorization": f"Bearer {KEY}"}


@pytest.mark.integration
@pytest.mark.parametrize(
    ("change", "key", "status", "message"),
    [
        ({}, None, 401, "missing or wrong API key"),
        ({}, "another-key", 401, "missing or wrong API key"),
        ({"model": "other"}, KEY, 404, "model 'other' is not served here"),
        (
            {"temperature": 0.7},
            KEY,
            400,
            "matches no sampling profile: train (temperature, top_p) = (1.0, 1.0), validation = (0.0, 1.0)",
        ),
        ({"top_p": None}, KEY, 400, "must both be set explicitly"),
        ({"top_k": 5}, KEY, 400, "top_k=5"),
        ({"stop": ["\n"]}, KEY, 400, "stop="),
        ({"presence_penalty": 0.5}, KEY, 400, "presence_penalty="),
        ({"n": 2}, KEY, 400, "n=2"),
        ({"top_logprobs": 3}, KEY, 400, "top_logprobs=3"),
        ({"messages": [{"role": "user", "content": "two " * 400}]}, KEY, 400, "context length"),
    ],
    ids=[
        "no_key",
        "wrong_key",
        "model",
        "pair",
        "top_p_left_out",
        "top_k",
        "stop",
        "penalty",
        "n",
        "top_logprobs",
        "context",
    ],
)
def test_the_refusals_the_page_lists(
    policy_servers: list[PolicyServer], change: dict, key: str | None, status: int, message: str
):
    body = {name: value for name, value in (MODEL_CALL | change).items() if value is not None}
    reply = post(f"{policy_servers[0].url}/chat/completions", body, key=key)
    assert reply.status_code == status, reply.text
    assert message in reply.text


@pytest.mark.integration
def test_the_validation_pair_is_served_too(policy_servers: list[PolicyServer], generator: ScriptedGenerator):
    reply = post(f"{policy_servers[0].url}/chat/completions", MODEL_CALL | {"temperature": 0.0})
    assert reply.status_code == 200, reply.text
    assert generator.requests[-1].sampling.greedy  # temperature 0 decodes greedily


def runner_of(config: RunConfig) -> GymRolloutRunner:
    """The trainer's rollout runner, built from the config as trainer/gym_setup.py builds it."""
    gym = config.env.gym
    settings = GymClientSettings(
        agent_urls=dict(gym.agent_urls) or None,
        head_server_url=gym.head_server_url,
        limits=gym,
        train_sampling=config.generation.train_profile,
        validation_sampling=config.generation.validation_profile,
        max_output_tokens=config.generation.max_new_tokens,
    )
    return GymRolloutRunner(
        settings, penalties=config.reward_penalties, decode=lambda ids: str(list(ids)), policy_version=lambda: 0
    )


@pytest.mark.integration
def test_the_page_row_trains_through_the_head_server_with_the_sampling_pairs_stamped_in(
    policy_servers: list[PolicyServer], generator: ScriptedGenerator
):
    # The built-in head, agent and math resources servers stand in for NeMo-Gym's, pointed at the policy servers
    # as the NeMo-Gym variables point its model server.
    urls = [server.url for server in policy_servers]
    seen_before = len(generator.requests)
    with launch_builtin_gym(urls, resources=("math",), max_steps=1, api_key=KEY) as gym:
        runner = runner_of(run_config(head_server_url=gym.head_url))
        try:
            assert runner.agent_urls() == {"math_simple_agent": gym.agent_urls["math_simple_agent"]}
            limited = copy.deepcopy(ROW)
            limited["responses_create_params"]["max_output_tokens"] = 8
            no_agent = {key: value for key, value in ROW.items() if key != "agent_ref"}  # the only agent plays it
            unknown = ROW | {"agent_ref": {"type": "responses_api_agents", "name": "no_such_agent"}}
            page, short, default, failed = runner.run_groups([ROW, limited, no_agent, unknown], [0, 1, 2, 3], 2, False)
            validation = runner.run_groups([ROW], [0], 1, validation=True)
        finally:
            runner.close()
    for group in (page, short, default):
        assert [trajectory.reward for trajectory in group] == [1.0, 1.0]  # type: ignore[union-attr]
    assert isinstance(failed, ValueError) and "'no_such_agent' is not a known agent" in str(failed)
    requests = generator.requests[seen_before:]
    train_requests, [validation_request] = requests[:-1], requests[-1:]
    assert len(train_requests) == 6 and all(
        r.sampling.temperature == 1.0 and r.sampling.top_p == 1.0 for r in train_requests
    )
    assert not any(r.sampling.greedy for r in train_requests) and validation_request.sampling.greedy
    # max_output_tokens: generation.max_new_tokens (16), or the row's own when smaller (8).
    assert sorted(r.sampling.max_new_tokens for r in train_requests) == [8, 8, 16, 16, 16, 16]
    assert [t.reward for t in validation[0]] == [1.0]  # type: ignore[union-attr]


@pytest.mark.integration
def test_agents_may_be_given_directly_and_an_absent_head_server_stops_the_lookup():
    direct = runner_of(run_config(head_server_url=None, agent_urls={"math_simple_agent": "http://127.0.0.1:9"}))
    try:
        assert direct.agent_urls() == {"math_simple_agent": "http://127.0.0.1:9"}
    finally:
        direct.close()
    absent = runner_of(run_config(head_server_url=f"http://127.0.0.1:{free_port()}"))
    try:
        with pytest.raises(httpx.ConnectError):
            absent.agent_urls()
    finally:
        absent.close()


def test_a_result_without_token_ids_cannot_be_trained_on():
    result = {
        "reward": 1.0,
        "response": {
            "output": [{"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "5"}]}]
        },
    }
    with pytest.raises(InvalidResultError, match="math_simple_agent"):
        trajectory_from_result(result, row=ROW, group_id=0, sample_index=0, policy_version=0)
