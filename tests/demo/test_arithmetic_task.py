"""The demo's addition task: right answers, disjoint deterministic splits, plausible wrong demonstrations."""

import random
import re
from collections import Counter
from pathlib import Path

import pytest

from asyncppo.data.rows import load_rows
from asyncppo.demo.arithmetic_task import (
    AdditionProblem,
    all_problems,
    is_correct_answer,
    make_arithmetic_splits,
    make_demonstrations,
    wrong_answer,
)

REPO = Path(__file__).parents[2]
SHIPPED = REPO / "examples" / "data" / "arithmetic"


def operands(question: str) -> tuple[int, int]:
    match = re.fullmatch(r"What is (\d+)\+(\d+)\?", question)
    assert match, question
    return int(match[1]), int(match[2])


def test_every_problem_states_its_operands_and_the_right_sum():
    problems = all_problems(19)
    assert len(problems) == 400 == len(set(problems))
    assert AdditionProblem(7, 12).row() == {"prompt": "What is 7+12?", "answer": "19"}
    for problem in problems:
        left, right = operands(problem.question)
        assert int(problem.answer) == left + right and problem.answer == str(int(problem.answer))


def test_splits_are_disjoint_deterministic_and_validation_ignores_num_train():
    train, validation = make_arithmetic_splits(num_validation=64, seed=0, max_operand=19)
    assert (len(train), len(validation)) == (336, 64)
    assert not set(train) & set(validation)
    assert make_arithmetic_splits(64, 0, 19) == (train, validation)
    small_train, same_validation = make_arithmetic_splits(64, 0, 19, num_train=10)
    assert same_validation == validation and small_train == train[:10]
    assert make_arithmetic_splits(64, 1, 19)[1] != validation
    with pytest.raises(ValueError, match="must fit in the 400 problems"):
        make_arithmetic_splits(64, 0, 19, num_train=337)


def test_wrong_answers_are_well_formed_near_misses():
    rng = random.Random(0)
    for problem in all_problems(19):
        right = int(problem.answer)
        for _ in range(5):
            wrong = wrong_answer(problem, rng)
            # A well-formed number (no leading zero, no sign) that is off by one or by one in the tens digit.
            assert wrong == str(int(wrong)) and int(wrong) >= 0
            assert abs(int(wrong) - right) in (1, 10), (problem, wrong)


def test_demonstrations_mix_right_and_wrong_answers_per_example():
    problems = all_problems(3)  # 16 problems, so each is drawn many times
    demonstrations = make_demonstrations(problems, 10_000, wrong_fraction=0.3, seed=0)
    for demonstration in demonstrations:
        left, right = operands(demonstration.question)
        assert demonstration.is_correct == (demonstration.answer == str(left + right))
    # Binomial(10000, 0.3): standard deviation 0.0046, so 0.02 is a > 4 sigma band.
    assert sum(not d.is_correct for d in demonstrations) / len(demonstrations) == pytest.approx(0.3, abs=0.02)
    wrong_per_question = Counter(d.question for d in demonstrations if not d.is_correct)
    right_per_question = Counter(d.question for d in demonstrations if d.is_correct)
    assert set(wrong_per_question) == set(right_per_question) == {p.question for p in problems}
    assert make_demonstrations(problems, 50, 0.3, seed=0) == demonstrations[:50]
    assert all(d.is_correct for d in make_demonstrations(problems, 200, 0.0, seed=1))


def test_is_correct_answer_is_exact_match_up_to_surrounding_whitespace():
    assert is_correct_answer(" 19\n", "19")
    assert not is_correct_answer("19.", "19")
    assert not is_correct_answer("019", "19")


def test_shipped_files_load_as_rows_with_right_answers_and_no_overlap():
    train, validation = load_rows(SHIPPED / "train.jsonl"), load_rows(SHIPPED / "validation.jsonl")
    assert (len(train), len(validation)) == (336, 64)
    assert not {row["prompt"] for row in train} & {row["prompt"] for row in validation}
    for row in train + validation:
        assert set(row) == {"prompt", "answer"}
        assert int(row["answer"]) == sum(operands(row["prompt"]))
