"""The reward-function contract (`checked_reward`): a finite int, float or bool within the deadline, or a
RewardFunctionError naming the function and the row, whatever else the function did (returned, raised or hung)."""

import math
import threading
from collections.abc import Mapping
from fractions import Fraction
from typing import Any

import numpy as np
import pytest

from asyncppo.rollout.rewards import RewardFunctionError, RewardTimeoutError, checked_reward

ROW = {"answer": "4", "id": "q7"}
WHERE = "row 2 (prompt group 17, sample 1)"


def _returning(value: object) -> Any:
    def reward(response_text: str, row: Mapping[str, Any]) -> object:
        return value

    return reward


@pytest.mark.parametrize(
    ("returned", "shown"),
    [
        pytest.param("1.0", "'1.0' (a str)", id="string"),
        pytest.param(None, "None (a NoneType)", id="none"),
        pytest.param(math.nan, "nan (a float)", id="nan"),
        pytest.param(math.inf, "inf (a float)", id="inf"),
        pytest.param(-math.inf, "-inf (a float)", id="minus_inf"),
        pytest.param(10**400, f"{str(10**400)[:60]}... (a int)", id="int_past_float"),
        pytest.param(np.array([0.5]), "array([0.5]) (a ndarray)", id="numpy_array"),
        pytest.param(np.array([[1.0, 0.0], [0.0, 1.0]]), "array([[1., 0.], [0., 1.]]) (a ndarray)", id="numpy_2d"),
        pytest.param(np.float64("nan"), "np.float64(nan) (a float64)", id="numpy_nan"),
    ],
)
def test_a_reward_that_is_not_a_finite_number_names_the_function_the_value_and_the_row(returned: object, shown: str):
    with pytest.raises(RewardFunctionError) as raised:
        checked_reward(_returning(returned), "text", ROW, WHERE)
    assert str(raised.value) == (
        f"reward function {__name__}._returning.<locals>.reward returned {shown} for {WHERE}, expected a finite "
        "number (int, float or bool); row: {'answer': '4', 'id': 'q7'}"
    )


@pytest.mark.parametrize(
    ("returned", "reward"),
    [
        (1, 1.0),
        (0.25, 0.25),
        (True, 1.0),
        (False, 0.0),
        (np.float32(0.5), 0.5),
        (np.int64(-2), -2.0),
        (Fraction(1, 4), 0.25),
    ],
)
def test_a_finite_int_float_or_bool_passes_as_a_float(returned: object, reward: float):
    assert checked_reward(_returning(returned), "text", ROW, WHERE, timeout_s=5.0) == reward


def _raising(response_text: str, row: Mapping[str, Any]) -> float:
    raise KeyError("no field 'solution'\nin this row")


def test_a_raising_reward_is_one_line_naming_the_function_the_error_and_the_row():
    with pytest.raises(RewardFunctionError) as raised:
        checked_reward(_raising, "text", ROW, WHERE, timeout_s=5.0)
    assert str(raised.value) == (
        f"reward function {__name__}._raising raised KeyError: \"no field 'solution'\\nin this row\" for {WHERE}; "
        "row: {'answer': '4', 'id': 'q7'}"
    )
    assert isinstance(raised.value.__cause__, KeyError)  # the original stays reachable for the Python API


def test_a_timeout_error_the_function_raises_itself_is_not_a_missed_deadline():
    def impatient(response_text: str, row: Mapping[str, Any]) -> float:
        raise TimeoutError("the grading service timed out")

    with pytest.raises(RewardFunctionError) as raised:
        checked_reward(impatient, "text", ROW, WHERE, timeout_s=5.0)
    assert not isinstance(raised.value, RewardTimeoutError)
    assert "raised TimeoutError: the grading service timed out" in str(raised.value)


def test_a_reward_that_never_returns_is_abandoned_at_its_deadline_naming_the_function():
    released = threading.Event()
    started = threading.Event()

    def stuck(response_text: str, row: Mapping[str, Any]) -> float:
        started.set()
        released.wait()  # a function that hangs until the test ends
        return 1.0

    try:
        with pytest.raises(RewardTimeoutError) as raised:
            checked_reward(stuck, "text", ROW, WHERE, timeout_s=0.2)
        assert str(raised.value) == (
            f"reward function {__name__}.test_a_reward_that_never_returns_is_abandoned_at_its_deadline_naming_the_"
            f"function.<locals>.stuck did not return within env.reward_timeout_s=0.2 s for {WHERE} (the call is "
            "abandoned on its thread); row: {'answer': '4', 'id': 'q7'}"
        )
        assert started.is_set()
        # The abandoned call still runs, on a daemon thread of its own (it cannot keep the process alive).
        (thread,) = [t for t in threading.enumerate() if t.name.startswith("reward ") and t.name.endswith(".stuck")]
        assert thread.daemon and thread.is_alive()
    finally:
        released.set()
