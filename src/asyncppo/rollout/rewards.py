"""Reward functions for single-turn rollouts: `(response_text, row) -> float`, and resolving one from a spec.

`run_single_turn_rollouts` calls them once per generation (from the collector's threads in async runs), through
`checked_reward`, which turns a non-number or a non-finite reward into a RewardFunctionError naming the function
and the row; the CLI builders turn the config's `reward_function` string into a callable with
`load_reward_function`.
"""

import importlib
import math
import re
import threading
from collections.abc import Callable, Mapping
from typing import Any

try:  # optional: symbolic comparison of LaTeX / expressions (pip package `math-verify`)
    import math_verify
except ImportError:  # pragma: no cover - exercised only where the package is absent
    math_verify = None

RewardFunction = Callable[[str, Mapping[str, Any]], float]

# math-verify's timeouts use signal.alarm, which only works on the main thread; elsewhere we run without one.
_MATH_VERIFY_TIMEOUT_SECONDS = 5
_BOXED = "\\boxed{"
_NUMBER = re.compile(r"-?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?:/\d+)?|-?\.\d+")
_LATEX_FRACTION = re.compile(r"^(-?)\\[dt]?frac\{(-?[\d.]+)\}\{(-?[\d.]+)\}$")
# How much of a row a reward error quotes to name it.
_ROW_QUOTE_CHARS = 120


class RewardFunctionError(ValueError):
    """A reward function returned something other than a finite number; names the function and the row."""


def checked_reward(reward_fn: RewardFunction, response_text: str, row: Mapping[str, Any], where: str) -> float:
    """`reward_fn(response_text, row)` as a float; RewardFunctionError unless it is a finite number.

    `where` names the row for the message (e.g. "row 3 (prompt group 17)"). A NaN or infinite reward would
    otherwise pass through the advantages into the loss and fail far from its cause.
    """
    value = reward_fn(response_text, row)
    try:
        reward = float(value)
    except (TypeError, ValueError, OverflowError):
        reward = None
    if reward is None or not math.isfinite(reward):
        name = f"{getattr(reward_fn, '__module__', '?')}.{getattr(reward_fn, '__qualname__', repr(reward_fn))}"
        row_text = repr(dict(row))
        if len(row_text) > _ROW_QUOTE_CHARS:
            row_text = row_text[:_ROW_QUOTE_CHARS] + "..."
        raise RewardFunctionError(
            f"reward function {name} returned {value!r} for {where}, expected a finite number; row: {row_text}"
        )
    return reward


def reference_answer(row: Mapping[str, Any]) -> str:
    """The row's `answer` field as text; ValueError naming the row's keys when it is missing."""
    if "answer" not in row:
        raise ValueError(f"the reward function needs an 'answer' field, but the row has keys {sorted(row)}")
    return str(row["answer"]).strip()


def exact_match_reward(response_text: str, row: Mapping[str, Any]) -> float:
    """1.0 when the response, stripped of surrounding whitespace, equals the row's `answer` (also stripped)."""
    return 1.0 if response_text.strip() == reference_answer(row) else 0.0


def last_boxed_content(text: str) -> str | None:
    r"""The content of the last \boxed{...} in `text`, braces balanced (\boxed{\frac{1}{2}} gives \frac{1}{2})."""
    start = text.rfind(_BOXED)
    if start < 0:
        return None
    depth, position = 1, start + len(_BOXED)
    for index in range(position, len(text)):
        depth += {"{": 1, "}": -1}.get(text[index], 0)
        if depth == 0:
            return text[position:index]
    return None  # unbalanced: the generation was cut inside the box


def parse_number(text: str) -> float | None:
    r"""`text` as a number: integers, decimals, 1,000-style grouping, a/b and \frac{a}{b}; None otherwise."""
    cleaned = text.strip().strip("$").strip().rstrip(".").replace(" ", "")
    if fraction := _LATEX_FRACTION.match(cleaned):
        sign, numerator, denominator = fraction.groups()
        cleaned = f"{sign}{numerator}/{denominator}"
    if not _NUMBER.fullmatch(cleaned):
        return None
    numerator, _, denominator = cleaned.replace(",", "").partition("/")
    if denominator and float(denominator) == 0:
        return None
    return float(numerator) / float(denominator) if denominator else float(numerator)


def numeric_match_reward(response_text: str, row: Mapping[str, Any]) -> float:
    r"""1.0 when the response's final answer equals the row's `answer` numerically (else textually), 0.0 otherwise.

    The final answer is the last \boxed{...} if there is one (none if it is left open), else the last number. Numbers
    compare with relative tolerance 1e-6; a non-numeric answer must match the boxed text exactly (spaces and
    `$` ignored). The fallback of `math_reward` where `math-verify` is not installed.
    """
    answer = reference_answer(row)
    boxed = last_boxed_content(response_text)
    if boxed is None and _BOXED in response_text:
        return 0.0  # the box was cut off: whatever number precedes it is not the final answer
    numbers = _NUMBER.findall(response_text)
    candidate = boxed if boxed is not None else (numbers[-1] if numbers else None)
    if candidate is None:
        return 0.0
    expected, found = parse_number(answer), parse_number(candidate)
    if expected is not None and found is not None:
        return 1.0 if math.isclose(found, expected, rel_tol=1e-6, abs_tol=1e-12) else 0.0
    normalise = lambda text: text.replace(" ", "").strip("$")  # noqa: E731
    return 1.0 if normalise(candidate) == normalise(answer) else 0.0


def math_reward(response_text: str, row: Mapping[str, Any]) -> float:
    """1.0 when the response's final answer is mathematically equal to the row's `answer`, else 0.0.

    With `math-verify` installed: its symbolic check (LaTeX, fractions, expressions, sets); an answer without
    `$` or \\boxed is read as inline math. Without it: `numeric_match_reward`.
    """
    answer = reference_answer(row)
    if math_verify is None:
        return numeric_match_reward(response_text, row)
    timeout = _MATH_VERIFY_TIMEOUT_SECONDS if threading.current_thread() is threading.main_thread() else None
    gold_text = answer if "$" in answer or _BOXED in answer else f"${answer}$"
    gold = math_verify.parse(gold_text, parsing_timeout=timeout)  # pyright: ignore[reportArgumentType]
    if not gold:
        raise ValueError(f"math-verify cannot parse the reference answer {answer!r} of the row")
    prediction = math_verify.parse(response_text, parsing_timeout=timeout)  # pyright: ignore[reportArgumentType]
    return 1.0 if math_verify.verify(gold, prediction, timeout_seconds=timeout) else 0.0


BUILTIN_REWARD_FUNCTIONS: dict[str, RewardFunction] = {"math": math_reward, "exact_match": exact_match_reward}


def load_reward_function(spec: str) -> RewardFunction:
    """ "math", "exact_match", or "package.module:function" (imported; dotted attributes allowed after the colon)."""
    if spec in BUILTIN_REWARD_FUNCTIONS:
        return BUILTIN_REWARD_FUNCTIONS[spec]
    module_name, colon, attribute_path = spec.partition(":")
    if not colon or not module_name or not attribute_path:
        raise ValueError(
            f"reward function {spec!r}: expected one of {sorted(BUILTIN_REWARD_FUNCTIONS)} or 'module:function'"
        )
    try:
        target: object = importlib.import_module(module_name)
    except ModuleNotFoundError as error:
        raise ValueError(f"reward function {spec!r}: cannot import module {module_name!r} ({error})") from error
    for attribute in attribute_path.split("."):
        if not hasattr(target, attribute):
            raise ValueError(f"reward function {spec!r}: module {module_name!r} has no attribute {attribute_path!r}")
        target = getattr(target, attribute)
    if not callable(target):
        raise ValueError(f"reward function {spec!r}: {attribute_path!r} is a {type(target).__name__}, not callable")
    return target  # pyright: ignore[reportReturnType]  # the signature is the user's contract
