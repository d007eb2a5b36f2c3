"""Reward functions on hand cases, and resolving them from a config string."""

import sys
import threading
from collections.abc import Mapping
from typing import Any

import pytest

from asyncppo.rollout import rewards
from asyncppo.rollout.rewards import (
    RewardModuleNotFoundError,
    RewardSpecError,
    exact_match_reward,
    last_boxed_content,
    load_reward_function,
    math_reward,
    numeric_match_reward,
)


@pytest.mark.parametrize(
    ("response", "answer", "expected"),
    [
        (" 42\n", "42", 1.0),  # surrounding whitespace is ignored
        ("42.", "42", 0.0),
        ("42", 42, 1.0),  # a non-string answer compares as text
        ("The answer is 42", "42", 0.0),
        ("Paris", " Paris ", 1.0),
    ],
)
def test_exact_match_compares_stripped_text(response: str, answer: object, expected: float) -> None:
    assert exact_match_reward(response, {"answer": answer}) == expected


@pytest.mark.parametrize("reward_function", [exact_match_reward, math_reward, numeric_match_reward])
def test_a_row_without_answer_is_an_error_naming_its_keys(reward_function: rewards.RewardFunction) -> None:
    with pytest.raises(ValueError, match=r"'answer' field, but the row has keys \['id', 'prompt'\]"):
        reward_function("42", {"prompt": "2*21?", "id": 3})


@pytest.mark.parametrize(
    ("response", "answer", "expected"),
    [
        ("so the total is 12, then 3 + 4 = 7", "7", 1.0),  # the last number is the answer
        ("7 apples, not 8", "7", 0.0),
        (r"First 3, then \boxed{\frac{3}{4}} and 9 more words", "0.75", 1.0),  # a box beats the last number
        (r"\boxed{1,000}", "1000", 1.0),
        ("It is -2.5.", "-5/2", 1.0),
        (r"\boxed{x + 1}", "x+1", 1.0),  # non-numeric: exact text without spaces
        (r"\boxed{x + 2}", "x+1", 0.0),
        ("no digits at all", "3", 0.0),
        (r"cut off inside \boxed{12", "12", 0.0),  # an unbalanced box is not an answer; no other number counts
    ],
)
def test_numeric_match_takes_the_boxed_or_last_number(response: str, answer: str, expected: float) -> None:
    assert numeric_match_reward(response, {"answer": answer}) == expected


def test_last_boxed_content_balances_nested_braces() -> None:
    assert last_boxed_content(r"\boxed{1} then \boxed{\frac{1}{\sqrt{2}}}.") == r"\frac{1}{\sqrt{2}}"
    assert last_boxed_content("no box") is None


@pytest.mark.parametrize(
    ("response", "answer", "expected"),
    [
        (r"The answer is $\boxed{\frac{1}{2}}$", "0.5", 1.0),
        ("so 2 + 3 = 5", "5", 1.0),
        ("so 2 + 3 = 6", "5", 0.0),
        (r"We get $\boxed{1+x}$", "x+1", 1.0),  # symbolic equality (math-verify) or exact text (fallback) fails
        (r"\boxed{3/4}", r"\frac{3}{4}", 1.0),
    ],
)
def test_math_reward_accepts_equal_values_in_other_notations(response: str, answer: str, expected: float) -> None:
    if rewards.math_verify is None and answer == "x+1":
        pytest.skip("symbolic equality needs math-verify")
    assert math_reward(response, {"answer": answer}) == expected


def test_math_reward_works_off_the_main_thread() -> None:
    # math-verify's signal-based timeout would raise outside the main thread; collector threads call rewards.
    results: list[float | BaseException] = []

    def score() -> None:
        try:
            results.append(math_reward(r"\boxed{10}", {"answer": "10"}))
        except BaseException as error:
            results.append(error)

    thread = threading.Thread(target=score)
    thread.start()
    thread.join()
    assert results == [1.0]


def test_math_reward_falls_back_to_numeric_match_without_math_verify(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(rewards, "math_verify", None)
    assert math_reward(r"\boxed{\frac{3}{4}}", {"answer": "0.75"}) == 1.0
    assert math_reward(r"\boxed{1+x}", {"answer": "x+1"}) == 0.0  # no symbolic algebra in the fallback


def test_builtin_and_module_reward_functions_resolve_by_name() -> None:
    assert load_reward_function("math") is math_reward
    assert load_reward_function("exact_match") is exact_match_reward
    assert load_reward_function("asyncppo.rollout.rewards:numeric_match_reward") is numeric_match_reward
    assert load_reward_function("asyncppo.rollout:rewards.exact_match_reward") is exact_match_reward


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("f1", r"expected one of \['exact_match', 'math'\] or 'module:function'"),
        ("asyncppo.no_such_module:f", "cannot import module 'asyncppo.no_such_module'"),
        ("asyncppo.rollout.rewards:no_such_function", "has no attribute 'no_such_function'"),
        ("math:pi", "'pi' is a float, not callable"),
        (":f", "or 'module:function'"),
    ],
)
def test_unresolvable_reward_specs_are_value_errors(spec: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        load_reward_function(spec)


def test_a_reward_module_imports_from_the_search_dirs_which_leave_the_import_path_after(tmp_path, fresh_modules):
    (tmp_path / "beside_the_config.py").write_text(
        "from reward_helper import EXPECTED\n\ndef reward(response_text, row):\n    return EXPECTED\n"
    )
    (tmp_path / "reward_helper.py").write_text("EXPECTED = 0.5\n")  # a sibling import works during the import
    path_before = list(sys.path)
    reward = load_reward_function("beside_the_config:reward", [tmp_path])
    assert reward("any text", {}) == 0.5
    assert sys.path == path_before


def test_a_reward_module_on_no_search_path_is_reported_as_not_found(tmp_path, fresh_modules):
    with pytest.raises(RewardModuleNotFoundError) as caught:
        load_reward_function("not_written_yet:reward", [tmp_path])
    assert caught.value.module_name == "not_written_yet"


def test_a_reward_module_that_fails_while_importing_names_the_error(tmp_path, fresh_modules):
    (tmp_path / "broken_reward.py").write_text("import a_package_nobody_installed\n")
    path_before = list(sys.path)
    with pytest.raises(RewardSpecError) as caught:
        load_reward_function("broken_reward:reward", [tmp_path])
    assert not isinstance(caught.value, RewardModuleNotFoundError)
    assert str(caught.value) == (
        "importing module 'broken_reward' raised ModuleNotFoundError: No module named 'a_package_nobody_installed'; "
        "fix the module (or install what it imports)"
    )
    assert sys.path == path_before


def _keyword_only_row(response_text: str, *, row: Mapping[str, Any]) -> float:
    return 0.0


def test_a_reward_function_must_take_the_text_and_the_row_positionally() -> None:
    with pytest.raises(RewardSpecError, match=r"has the signature \(response_text: str, \*, row: "):
        load_reward_function(f"{__name__}:_keyword_only_row")
