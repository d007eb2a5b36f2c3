"""Property test: random and hostile bodies on the policy server's POST routes get a 4xx (never a 500) with an
OpenAI error body, and a valid request is served afterwards. One real server (tiny model) for every example."""

import json
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest
from gym_fakes import policy_server_of
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from transformers import PreTrainedTokenizerBase

from asyncppo.generation.hf_generator import HFGenerator
from asyncppo.models.policy import load_policy
from asyncppo.models.tiny import EOS_TOKEN_ID, PAD_TOKEN_ID

ROUTES = ("/v1/chat/completions", "/v1/responses", "/tokenize")
SAMPLING = {"model": "policy", "temperature": 1.0, "top_p": 1.0}
# Valid bodies per route, output limited to 2 tokens so that a mutation which stays valid generates quickly.
VALID = {
    "/v1/chat/completions": SAMPLING | {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2},
    "/v1/responses": SAMPLING | {"input": [{"role": "user", "content": "hi"}], "max_output_tokens": 2},
    "/tokenize": {"model": "policy", "messages": [{"role": "user", "content": "hi"}]},
}
# Fields a mutation replaces; the output limits are left alone (an unset one lets a valid request run long).
KNOWN_FIELDS = (
    "model", "messages", "input", "tools", "temperature", "top_p", "top_k", "n", "stream", "stop", "logit_bias",
    "top_logprobs", "required_prefix_token_ids", "chat_template_kwargs", "instructions", "text", "prompt",
    "add_generation_prompt", "tool_choice", "metadata", "role", "content",
)  # fmt: skip

lone_surrogates = st.characters(min_codepoint=0xD800, max_codepoint=0xDFFF)
hostile_text = st.text(st.characters(codec="utf-8") | lone_surrogates, max_size=12)
huge_ints = st.integers(min_value=2**63 - 2, max_value=2**80) | st.integers(min_value=-(2**80), max_value=-1)
scalars = st.none() | st.booleans() | st.integers() | huge_ints | st.floats(allow_nan=False, allow_infinity=False)
json_values = st.recursive(
    scalars | hostile_text,
    lambda children: st.lists(children, max_size=3) | st.dictionaries(hostile_text, children, max_size=3),
    max_leaves=12,
)
# A message or item of roughly the right shape, with hostile values in it.
messages = st.lists(
    st.fixed_dictionaries({"role": st.sampled_from(["user", "assistant", "tool", "robot"]), "content": json_values}),
    max_size=3,
)


@st.composite
def mutated_bodies(draw: st.DrawFn) -> tuple[str, str]:
    """(route, JSON text) of a valid body with one known field replaced by a hostile value."""
    route = draw(st.sampled_from(ROUTES))
    body = dict(VALID[route])
    field = draw(st.sampled_from(KNOWN_FIELDS))
    body[field] = draw(messages if field in ("messages", "input") else json_values)
    return route, json.dumps(body)  # ensure_ascii escapes lone surrogates as \udXXX, as a hostile client would


@st.composite
def raw_bodies(draw: st.DrawFn) -> tuple[str, str]:
    """(route, text) with a non-finite or overlong number spliced in, or bytes that are not JSON at all."""
    route = draw(st.sampled_from(ROUTES))
    number = draw(st.sampled_from(["NaN", "Infinity", "-Infinity", "1e400", "9" * 5000, "-0", "1" * 30]))
    field = draw(st.sampled_from(["temperature", "top_p", "max_tokens", "max_output_tokens", "n", "top_k"]))
    valid = json.dumps(VALID[route])
    spliced = valid[:-1] + f', "{field}": {number}}}'
    garbage = draw(st.text(max_size=30))
    return route, draw(st.sampled_from([spliced, garbage, "[" * 3000, valid[: len(valid) // 2]]))


@pytest.fixture(scope="module")
def root(tiny_dir: Path, tokenizer: PreTrainedTokenizerBase) -> Iterator[str]:
    engine = HFGenerator(load_policy(tiny_dir), [EOS_TOKEN_ID], PAD_TOKEN_ID, 8, "cpu", seed=0, max_context_length=256)
    with policy_server_of(engine, tokenizer, max_model_len=256) as server:
        yield server.url.removesuffix("/v1")
    engine.close()


def post(root: str, route: str, text: str) -> httpx.Response:
    raw = text.encode("utf-8", "surrogatepass")  # a lone surrogate from `garbage` goes out as the bytes it encodes
    return httpx.post(f"{root}{route}", content=raw, headers={"Content-Type": "application/json"}, timeout=60)


def assert_client_error(response: httpx.Response) -> None:
    assert response.status_code < 500, response.text
    if response.status_code >= 400:
        error = response.json()["error"]
        assert isinstance(error["message"], str) and error["code"] == response.status_code


def assert_still_serving(root: str) -> None:
    for route, body in VALID.items():
        assert httpx.post(f"{root}{route}", json=body, timeout=60).status_code == 200, route


BOUNDED = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def test_random_json_bodies_never_get_a_500(root: str) -> None:
    @BOUNDED
    @given(route=st.sampled_from(ROUTES), body=json_values)
    def post_random(route: str, body: object) -> None:
        assert_client_error(post(root, route, json.dumps(body)))

    post_random()
    assert_still_serving(root)


@pytest.mark.parametrize(
    "bodies",
    [
        pytest.param(mutated_bodies, id="valid_bodies_with_a_hostile_field"),
        pytest.param(raw_bodies, id="non_finite_numbers_and_broken_json"),
    ],
)
def test_hostile_bodies_never_get_a_500(root: str, bodies: Callable[[], st.SearchStrategy[tuple[str, str]]]) -> None:
    @BOUNDED
    @given(case=bodies())
    def post_case(case: tuple[str, str]) -> None:
        assert_client_error(post(root, *case))

    post_case()
    assert_still_serving(root)
