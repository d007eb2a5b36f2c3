"""The built-in resources servers over FastAPI's in-process client: seeding, tools, session cookies, verify."""

import pytest
from fastapi.testclient import TestClient

from asyncppo.gym.servers.resources import (
    SESSION_COOKIE,
    create_resources_app,
    final_assistant_text,
    forecast,
)


def answer(text: str) -> dict:
    """A Responses object whose output ends with an assistant message saying `text`."""
    message = {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": text}]}
    return {"output": [{"type": "function_call", "name": "x", "arguments": "{}"}, message]}


def test_final_assistant_text_reads_the_last_assistant_message() -> None:
    response = answer("second")
    response["output"].insert(0, {"type": "message", "role": "assistant", "content": "first"})
    assert final_assistant_text(response) == "second"
    assert final_assistant_text({"output": [{"type": "function_call_output", "output": "7"}]}) == ""
    assert final_assistant_text(None) == ""


@pytest.mark.parametrize(
    ("text", "reward"),
    [("3 + 1 makes 4", 1.0), ("It is 4, no, 5", 0.0), ("four", 0.0), ("\\boxed{4.0}", 1.0), ("1,004", 0.0)],
)
def test_math_verify_rewards_the_last_number_of_the_final_answer(text: str, reward: float) -> None:
    client = TestClient(create_resources_app("math"))
    assert client.post("/seed_session", json={"responses_create_params": {}}).json() == {}
    body = {"responses_create_params": {"input": "2+2?"}, "expected_answer": "4", "response": answer(text)}
    result = client.post("/verify", json=body).json()
    assert result["reward"] == reward
    assert result["expected_answer"] == "4" and result["responses_create_params"] == {"input": "2+2?"}


def test_weather_tool_is_deterministic_and_verify_needs_the_returned_temperature() -> None:
    client = TestClient(create_resources_app("weather"))
    client.post("/seed_session", json={})
    paris = client.post("/get_weather", json={"city": "Paris"}).json()
    assert paris == forecast("Paris")
    assert forecast(" paris ")["temperature_c"] == paris["temperature_c"]
    assert str(paris["temperature_c"]) in paris["weather_description"]
    wrong = paris["temperature_c"] + 1
    assert client.post("/verify", json={"response": answer(f"It is {wrong} C")}).json()["reward"] == 0.0
    client.post("/seed_session", json={})  # verify ended the session; a new one starts empty
    client.post("/get_weather", json={"city": "Paris"})
    text = f"Paris: {paris['temperature_c']} degrees"
    assert client.post("/verify", json={"response": answer(text)}).json()["reward"] == 1.0


def test_weather_tool_feeds_bad_arguments_back_as_an_error_body() -> None:
    client = TestClient(create_resources_app("weather"))
    client.post("/seed_session", json={})
    reply = client.post("/get_weather", json={"town": "Paris"})
    assert reply.status_code == 400 and "city" in reply.json()["error"]


def test_session_counter_keeps_one_count_per_session_cookie() -> None:
    app = create_resources_app("session_counter")
    first, second = TestClient(app), TestClient(app)
    first.post("/seed_session", json={"initial_count": 3})
    second.post("/seed_session", json={})
    assert first.cookies.get(SESSION_COOKIE) != second.cookies.get(SESSION_COOKIE)
    assert [first.post("/increment", json={}).json()["count"] for _ in range(2)] == [4, 5]
    assert second.post("/increment", json={}).json() == {"count": 1}
    assert first.post("/verify", json={"target_count": 5, "response": answer("5")}).json()["reward"] == 1.0
    assert second.post("/verify", json={"target_count": 2, "response": answer("2")}).json()["reward"] == 0.0


def test_session_counter_refuses_calls_without_a_seeded_session() -> None:
    client = TestClient(create_resources_app("session_counter"))
    assert client.post("/increment", json={}).status_code == 400
    client.post("/seed_session", json={})
    client.post("/verify", json={"target_count": 0})
    assert client.post("/increment", json={}).status_code == 400  # verify ended the session
    assert client.post("/seed_session", json={"initial_count": "3"}).status_code == 422


def test_unknown_resources_server_name_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown built-in resources server 'chess'"):
        create_resources_app("chess")
