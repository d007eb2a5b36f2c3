"""The innermost error of an agent's error body (gym/error_bodies.py), on 500 bodies shaped as NeMo-Gym sends them.

The fixtures `run_500_wrapped_*.json` are the raw bodies of an agent's `/run` 500 after three hops (policy server
-> model server `VLLMModel___policy_model` -> agent `/v1/responses` -> agent `/run`): each hop's body is a JSON
string `Hit an exception in <Server> calling an inner server: <inner body as a Python bytes literal>`. Inner
bodies: vLLM's 404 for a wrong model name, the policy server's OpenAI-style 400 for a full context, and a crash
answered as the `repr` of the exception.
"""

import json
from pathlib import Path

import pytest

from asyncppo.gym import error_bodies
from asyncppo.gym.error_bodies import unwrap_error_body

FIXTURES = Path(__file__).parent / "fixtures"
HOPS = ("SimpleAgent___math_simple_agent", "SimpleAgent___math_simple_agent", "VLLMModel___policy_model")


def wrap(server: str, inner: str) -> str:
    """One hop of NeMo-Gym's exception middleware: a JSON string, the inner body printed as a bytes literal."""
    return json.dumps(f"Hit an exception in {server} calling an inner server: {inner.encode()}")


def test_a_wrapped_policy_404_gives_the_innermost_message_and_status() -> None:
    body = unwrap_error_body((FIXTURES / "run_500_wrapped_policy_404.json").read_text())
    assert body.message == "The model `policy-typo` does not exist."
    assert body.hops == HOPS and body.inner_client_status == 404


def test_a_wrapped_context_length_400_gives_the_whole_message() -> None:
    body = unwrap_error_body((FIXTURES / "run_500_wrapped_policy_400_context_length.json").read_text())
    assert body.message == (
        "This model's maximum context length is 1024 tokens, but the prompt has 1100 tokens, which leaves no room "
        "to generate"
    )
    assert body.hops == HOPS and body.inner_client_status == 400


def test_a_wrapped_crash_has_its_repr_as_message_and_no_client_status() -> None:
    body = unwrap_error_body((FIXTURES / "run_500_wrapped_policy_crash.json").read_text())
    assert body.message.startswith("RuntimeError('engine step failed: CUDA error")
    assert body.hops == HOPS and body.inner_client_status is None


def test_only_integer_4xx_codes_are_client_statuses() -> None:
    for code in (429, 500, "invalid_api_key", True):
        inner = json.dumps({"error": {"message": "m", "code": code}})
        assert unwrap_error_body(wrap("VLLMModel___p", inner)).inner_client_status == (429 if code == 429 else None)


def test_unwrapped_bodies_of_every_known_shape() -> None:
    assert unwrap_error_body('{"error": "POST x answered 404: no"}').message == "POST x answered 404: no"
    assert unwrap_error_body('{"detail": [{"loc": ["body"]}]}').message == '[{"loc": ["body"]}]'
    assert unwrap_error_body("plain text, not JSON").message == "plain text, not JSON"
    plain = unwrap_error_body('{"error": {"message": "bad", "code": 400}}')
    assert plain.message == "bad" and plain.hops == () and plain.inner_client_status == 400


def test_a_malformed_inner_literal_is_quoted_as_it_stands() -> None:
    body = unwrap_error_body(json.dumps("Hit an exception in A calling an inner server: b'unterminated"))
    assert body.hops == ("A",) and body.message == "b'unterminated"


def test_nesting_deeper_than_the_bound_stops_there(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(error_bodies, "MAX_HOPS", 2)  # each real hop makes the body 4x longer: test the bound small
    text = wrap("A", wrap("B", wrap("C", json.dumps({"error": {"message": "deep", "code": 404}}))))
    body = unwrap_error_body(text)
    assert body.hops == ("A", "B") and body.inner_client_status is None
    assert body.message.startswith('"Hit an exception in C calling an inner server')
