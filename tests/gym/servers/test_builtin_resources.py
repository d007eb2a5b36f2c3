"""The built-in resources servers over FastAPI's in-process client: seeding, tools, session cookies, verify."""

import pytest
from fastapi.testclient import TestClient

from asyncppo.gym.servers.resources import (
    MULTI_STEP_TOOLS,
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


def multi_step_client(operands: list[int]) -> TestClient:
    """A client of a fresh multi_step server with a seeded session for `operands`."""
    client = TestClient(create_resources_app("multi_step"))
    reply = client.post("/seed_session", json={"responses_create_params": {}, "operands": operands})
    assert reply.status_code == 200 and reply.json() == {}
    return client


def multi_step_verify(client: TestClient, text: str, expected_answer: str = "57") -> dict:
    body = {"responses_create_params": {"input": "x"}, "expected_answer": expected_answer, "response": answer(text)}
    reply = client.post("/verify", json=body)
    assert reply.status_code == 200, reply.text
    return reply.json()


def test_multi_step_tools_answer_compact_json_results() -> None:
    client = multi_step_client([12, 7, 3])
    assert client.post("/add", json={"a": 12, "b": 7}).text == '{"result":19}'  # the text the model reads
    assert client.post("/multiply", json={"a": 19, "b": 3}).json() == {"result": 57}
    assert client.post("/multiply", json={"a": -4, "b": 0}).json() == {"result": 0}
    assert [tool["name"] for tool in MULTI_STEP_TOOLS] == ["add", "multiply"]
    assert all(tool["parameters"]["required"] == ["a", "b"] for tool in MULTI_STEP_TOOLS)


@pytest.mark.parametrize(
    ("arguments", "named"),
    [
        ({"b": 7}, "`a`, it is missing"),
        ({"a": 12}, "`b`, it is missing"),
        ({"a": "12", "b": 7}, "`a`, got '12'"),
        ({"a": 12, "b": 7.5}, "`b`, got 7.5"),
        ({"a": True, "b": 7}, "`a`, got True"),  # JSON true is not an integer
        ({"a": 12, "b": None}, "`b`, got None"),
    ],
)
def test_multi_step_bad_arguments_answer_400_naming_the_field_and_value(arguments: dict, named: str) -> None:
    client = multi_step_client([12, 7, 3])
    reply = client.post("/add", json=arguments)
    assert reply.status_code == 400
    assert reply.json()["error"].startswith("add needs an integer") and named in reply.json()["error"]


def test_multi_step_sessions_are_isolated_and_count_their_own_calls() -> None:
    app = create_resources_app("multi_step")
    first, second = TestClient(app), TestClient(app)
    first.post("/seed_session", json={"operands": [12, 7, 3]})
    second.post("/seed_session", json={"operands": [1, 2, 5]})
    assert first.cookies.get(SESSION_COOKIE) != second.cookies.get(SESSION_COOKIE)
    first.post("/add", json={"a": 12, "b": 7})
    first.post("/add", json={"a": 12})  # a bad call still counts as a call
    first.post("/multiply", json={"a": 19, "b": 3})
    second.post("/add", json={"a": 1, "b": 2})
    one = first.post("/verify", json={"expected_answer": "57", "response": answer("57")}).json()
    two = second.post("/verify", json={"expected_answer": "15", "response": answer("15")}).json()
    assert (one["num_tool_calls"], one["dependent_calls_ok"]) == (3, True)
    # The second session saw only its own add: no multiply of the first session leaks into it.
    assert (two["num_tool_calls"], two["dependent_calls_ok"], two["reward"]) == (1, False, 1.0)


@pytest.mark.parametrize(
    ("text", "reward"),
    [("57", 1.0), ("(12 + 7) * 3 = 57.", 1.0), ("57.0", 1.0), ("57, or 58", 0.0), ("fifty-seven", 0.0), ("", 0.0)],
)
def test_multi_step_verify_rewards_the_last_number_with_matching_components(text: str, reward: float) -> None:
    client = multi_step_client([12, 7, 3])
    result = multi_step_verify(client, text)
    assert result["reward"] == reward and result["reward_components"] == {"correct_answer": reward}
    assert sum(result["reward_components"].values()) == result["reward"]
    assert result["expected_answer"] == "57" and result["responses_create_params"] == {"input": "x"}  # echoed
    assert result["num_tool_calls"] == 0 and result["dependent_calls_ok"] is False


@pytest.mark.parametrize(
    ("calls", "ok"),
    [
        ([("add", 12, 7), ("multiply", 19, 3)], True),
        ([("add", 7, 12), ("multiply", 3, 19)], True),  # either argument order
        ([("add", 12, 7), ("add", 1, 1), ("multiply", 19, 3)], True),  # a detour between the two is fine
        ([("multiply", 19, 3), ("add", 12, 7)], False),  # multiply first: it did not use the add's output
        ([("add", 12, 7), ("multiply", 20, 3)], False),  # the add result was not passed on
        ([("add", 12, 7), ("multiply", 19, 4)], False),  # wrong c
        ([("add", 12, 8), ("multiply", 20, 3)], False),  # the add was not of a and b
        ([("multiply", 19, 3)], False),
    ],
)
def test_multi_step_dependent_calls_need_add_then_multiply_of_its_result(calls: list, ok: bool) -> None:
    client = multi_step_client([12, 7, 3])
    for name, a, b in calls:
        assert client.post(f"/{name}", json={"a": a, "b": b}).status_code == 200
    result = multi_step_verify(client, "57")
    assert result["dependent_calls_ok"] is ok and result["num_tool_calls"] == len(calls)
    assert result["reward"] == 1.0  # diagnostic only: the answer alone decides the reward


def test_multi_step_refuses_bad_operands_missing_sessions_and_non_numeric_answers() -> None:
    client = TestClient(create_resources_app("multi_step"))
    assert client.post("/add", json={"a": 1, "b": 2}).status_code == 400  # not seeded
    for operands in (None, [1, 2], [1, 2, "3"], [1, True, 3], "1,2,3"):
        reply = client.post("/seed_session", json={"operands": operands})
        assert reply.status_code == 422 and "three integers" in reply.json()["error"], operands
    client = multi_step_client([1, 2, 3])
    reply = client.post("/verify", json={"expected_answer": "nine", "response": answer("9")})
    assert reply.status_code == 422 and "'nine'" in reply.json()["error"]
    client = multi_step_client([1, 2, 3])
    assert multi_step_verify(client, "9", "9")["reward"] == 1.0
    assert client.post("/multiply", json={"a": 3, "b": 3}).status_code == 400  # verify ended the session


def test_unknown_resources_server_name_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown built-in resources server 'chess'"):
        create_resources_app("chess")
