"""The multi-step tool task: answers, disjoint deterministic splits, noisy plays, turns exactly as rendered."""

import json
import random
import re
from collections import Counter
from pathlib import Path

import pytest

from asyncppo.demo.tool_task import (
    AGENT_REF,
    ChainProblem,
    ParsedCall,
    all_problems,
    call_tool,
    demonstrate,
    is_well_formed_turn,
    make_demonstrations,
    make_tool_task_splits,
    near_miss,
    parse_generation,
    reward,
)
from asyncppo.gym import chat_prompt
from asyncppo.gym.servers.resources import last_number as verify_last_number
from asyncppo.models.tiny import TINY, build_tiny_tokenizer

REPO = Path(__file__).parents[2]
SHIPPED = REPO / "examples" / "data" / "multi_step"
QUESTION = re.compile(r"Compute \((\d+) \+ (\d+)\) \* (\d+)\. Use the add and multiply tools\.")


def operands(question: str) -> tuple[int, int, int]:
    match = QUESTION.fullmatch(question)
    assert match, question
    return int(match[1]), int(match[2]), int(match[3])


def test_a_problem_row_is_the_gym_run_body_with_operands_and_the_expected_answer():
    assert ChainProblem(12, 7, 3).row() == {
        "responses_create_params": {
            "input": [{"role": "user", "content": "Compute (12 + 7) * 3. Use the add and multiply tools."}]
        },
        "operands": [12, 7, 3],
        "expected_answer": "57",
        "agent_ref": {"type": "responses_api_agents", "name": "multi_step_simple_agent"},
    }


def test_every_problem_states_its_operands_and_the_right_answer():
    problems = all_problems(20, 2, 9)
    assert len(problems) == 20 * 20 * 8 == len(set(problems))
    for problem in problems:
        a, b, c = operands(problem.question)
        assert (a, b, c) == (problem.a, problem.b, problem.c)
        assert problem.answer == str((a + b) * c)
    with pytest.raises(ValueError, match="min_multiplier"):
        all_problems(20, 5, 4)


def test_splits_are_disjoint_deterministic_and_validation_ignores_num_train():
    train, validation = make_tool_task_splits(num_validation=64, seed=0)
    assert (len(train), len(validation)) == (3136, 64)
    assert not set(train) & set(validation)
    assert make_tool_task_splits(64, 0) == (train, validation)
    small_train, same_validation = make_tool_task_splits(64, 0, num_train=10)
    assert same_validation == validation and small_train == train[:10]
    assert make_tool_task_splits(64, 1)[1] != validation
    with pytest.raises(ValueError, match="must fit in the 3200 problems"):
        make_tool_task_splits(64, 0, num_train=3137)


def test_near_misses_are_well_formed_numbers_off_by_one_in_one_digit():
    rng = random.Random(0)
    for value in range(1, 400):
        for _ in range(5):
            wrong = near_miss(value, rng)
            # Off by one (units), or one digit moved by one: a difference of 1, 10 or 100; never 0 or below 1.
            assert wrong >= 1 and abs(wrong - value) in (1, 10, 100), (value, wrong)


def test_a_correct_play_calls_add_then_multiply_on_the_results_and_answers_the_product():
    messages = demonstrate(ChainProblem(12, 7, 3), "none", random.Random(0)).messages
    assert [message["role"] for message in messages] == ["user", "assistant", "tool", "assistant", "tool", "assistant"]
    add, multiply = (messages[index]["tool_calls"][0]["function"] for index in (1, 3))
    assert add == {"name": "add", "arguments": '{"a": 12, "b": 7}'}
    assert multiply == {"name": "multiply", "arguments": '{"a": 19, "b": 3}'}
    assert [messages[index]["content"] for index in (2, 4, 5)] == ['{"result":19}', '{"result":57}', "57"]


def test_noisy_plays_mix_both_kinds_of_mistake_and_stay_consistent_with_the_tools():
    problems = all_problems(3, 2, 3)  # 18 problems, so each is drawn many times
    demonstrations = make_demonstrations(problems, 10_000, wrong_fraction=0.4, seed=0)
    for demonstration in demonstrations:
        a, b, c = operands(demonstration.messages[0]["content"])
        multiply_arguments = json.loads(demonstration.messages[3]["tool_calls"][0]["function"]["arguments"])
        tool_results = [json.loads(demonstration.messages[index]["content"])["result"] for index in (2, 4)]
        final = int(demonstration.messages[5]["content"])
        # The tools always answer the arguments actually passed, whatever the mistake.
        assert tool_results == [a + b, multiply_arguments["a"] * c] and multiply_arguments["b"] == c
        copied_right = multiply_arguments["a"] == a + b
        assert copied_right == (demonstration.mistake != "copy")
        assert (final == tool_results[1]) == (demonstration.mistake != "answer")
        assert demonstration.is_correct == (final == (a + b) * c)
    # Binomial(10000, 0.2) per kind: standard deviation 0.004, so 0.02 is a > 4 sigma band.
    kinds = Counter(demonstration.mistake for demonstration in demonstrations)
    assert kinds["answer"] / 10_000 == pytest.approx(0.2, abs=0.02)
    assert kinds["copy"] / 10_000 == pytest.approx(0.2, abs=0.02)
    assert make_demonstrations(problems, 50, 0.4, seed=0) == demonstrations[:50]
    assert all(d.is_correct for d in make_demonstrations(problems, 200, 0.0, seed=1))


def test_each_turn_renders_as_the_policy_server_prompts_and_the_model_generates_it():
    tokenizer = build_tiny_tokenizer(TINY.vocab_size)
    messages = demonstrate(ChainProblem(12, 7, 3), "none", random.Random(0)).messages

    def render(upto: int, add_generation_prompt: bool) -> str:
        text = tokenizer.apply_chat_template(
            messages[:upto], tokenize=False, add_generation_prompt=add_generation_prompt
        )
        assert isinstance(text, str)
        return text

    # Written out by hand from chat_template.py: an assistant turn with empty content and one call renders the
    # bare block; the arguments string goes in verbatim (json.dumps spacing), the tool output is compact.
    generations = {
        1: '<tool_call>\n{"name": "add", "arguments": {"a": 12, "b": 7}}\n</tool_call>',
        3: '<tool_call>\n{"name": "multiply", "arguments": {"a": 19, "b": 3}}\n</tool_call>',
        5: "57",
    }
    tool_turns = {
        2: '<|im_start|>tool\n<tool_response>\n{"result":19}\n</tool_response><|im_end|>\n',
        4: '<|im_start|>tool\n<tool_response>\n{"result":57}\n</tool_response><|im_end|>\n',
    }
    assert render(1, True).endswith("tools.<|im_end|>\n<|im_start|>assistant\n")
    for index, generation in generations.items():
        # The prompt of turn k, then exactly the generation and <|im_end|>; the template adds "\n" after.
        assert render(index + 1, False) == render(index, True) + generation + "<|im_end|>\n"
        content, calls = parse_generation(generation)
        assert is_well_formed_turn(content, calls)
    for index, text in tool_turns.items():
        assert render(index + 1, False) == render(index, False) + text


@pytest.mark.parametrize(
    "text",
    [
        '<tool_call>\n{"name": "add", "arguments": {"a": 12, "b": 7}}\n</tool_call>',
        'Let me add.\n<tool_call>\n{"name": "add", "arguments": {"a": 1}}\n</tool_call>',
        '<tool_call>\n{"name": "add", "arguments": {"a": 12, "b": 7}\n</tool_call>',  # one brace short
        '<tool_call>{"arguments": {}}</tool_call> 5',
        "57",
        "",
    ],
)
def test_the_parser_reads_generations_like_the_policy_server(text):
    content, calls = parse_generation(text)
    server_content, server_calls = chat_prompt.parse_generation(text)
    assert content == server_content
    assert [(call.name, call.arguments) for call in calls] == [
        (call.function.name, json.loads(call.function.arguments)) for call in server_calls
    ]


def test_the_tools_add_and_multiply_integers_and_answer_anything_else_with_an_error():
    assert call_tool(ParsedCall("add", {"a": 12, "b": 7})) == '{"result":19}'
    assert call_tool(ParsedCall("multiply", {"a": 19, "b": 3})) == '{"result":57}'
    for call in [
        ParsedCall("subtract", {"a": 1, "b": 2}),
        ParsedCall("add", {"a": 1}),
        ParsedCall("add", {"a": "1", "b": 2}),
        ParsedCall("add", {"a": True, "b": 2}),
        ParsedCall("add", [1, 2]),
    ]:
        assert "error" in json.loads(call_tool(call)), call


def test_turn_shapes_other_than_one_clean_call_or_a_bare_number_are_not_well_formed():
    assert is_well_formed_turn("57", []) and not is_well_formed_turn("The answer is 57", [])
    assert not is_well_formed_turn("", [ParsedCall("add", {"a": 1, "b": 2})] * 2)
    assert not is_well_formed_turn("Sure.", [ParsedCall("add", {"a": 1, "b": 2})])
    assert not is_well_formed_turn("", [ParsedCall("add", {"a": 1, "b": 2, "c": 3})])
    assert not is_well_formed_turn("", [ParsedCall("add", {"a": 1.0, "b": 2})])


@pytest.mark.parametrize(
    ("text", "expected"),
    [("57", 1.0), ("The answer is 57.", 1.0), ("56 or 57", 1.0), ("57 or 56", 0.0), ("", 0.0), ("1,057", 0.0)],
)
def test_the_reward_is_whether_the_last_number_is_the_answer_as_the_gym_verifies(text, expected):
    assert reward(text, "57") == expected
    assert (verify_last_number(text) == 57.0) == (expected == 1.0)


def test_shipped_rows_are_gym_bodies_with_right_answers_and_no_overlap():
    train, validation = (
        [json.loads(line) for line in (SHIPPED / name).open()] for name in ("train.jsonl", "validation.jsonl")
    )
    assert (len(train), len(validation)) == (3136, 64)
    assert not {tuple(row["operands"]) for row in train} & {tuple(row["operands"]) for row in validation}
    for row in train + validation:
        assert set(row) == {"responses_create_params", "operands", "expected_answer", "agent_ref"}
        assert "tools" not in row["responses_create_params"] and row["agent_ref"] == AGENT_REF
        (message,) = row["responses_create_params"]["input"]
        a, b, c = operands(message["content"])
        assert row["operands"] == [a, b, c] and row["expected_answer"] == str((a + b) * c)
