"""Reward functions for single-turn rollouts: `(response_text, row) -> float`, and resolving one from a spec.

`run_single_turn_rollouts` calls them once per generation (from the collector's threads in async runs), through
`checked_reward`, which turns a non-number or a non-finite reward into a RewardFunctionError naming the function
and the row; the trainer's pre-flight turns the config's `reward_function` string into a callable with
`load_reward_function` (which checks the module imports and the signature fits).
"""

import importlib
import inspect
import math
import re
import sys
import threading
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
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


class RewardSpecError(ValueError):
    """env.reward_function names no usable function; the message says what is wrong and what to do."""


class RewardModuleNotFoundError(RewardSpecError):
    """The module of a `module:function` spec is on no search path (as opposed to failing while it runs)."""

    def __init__(self, module_name: str, detail: str):
        super().__init__(f"cannot import module {module_name!r} ({detail})")
        self.module_name = module_name
        self.detail = detail


def load_reward_function(spec: str, search_dirs: Sequence[Path] = ()) -> RewardFunction:
    """A built-in ("math", "exact_match") or "module:function" (dotted attributes allowed after the colon).

    The module is imported with `search_dirs` in front of sys.path, for the import only: the trainer passes the
    config file's directory and the working directory, so a `mymod.py` beside either imports without PYTHONPATH,
    and its own top-level imports of files beside it work. They are removed afterwards so that a file there
    (say a `random.py`) cannot shadow a module the trainer imports later. The function must accept
    `(response_text, row)` positionally. RewardSpecError (RewardModuleNotFoundError when the module is on no
    path) says what is wrong otherwise.
    """
    if spec in BUILTIN_REWARD_FUNCTIONS:
        return BUILTIN_REWARD_FUNCTIONS[spec]
    module_name, colon, attribute_path = spec.partition(":")
    if not colon or not module_name or not attribute_path:
        raise RewardSpecError(
            f"{spec!r} is not a built-in reward function; expected one of {sorted(BUILTIN_REWARD_FUNCTIONS)} or "
            "'module:function'"
        )
    target: object = _import_reward_module(module_name, search_dirs)
    for attribute in attribute_path.split("."):
        if not hasattr(target, attribute):
            raise RewardSpecError(
                f"module {module_name!r} ({getattr(target, '__file__', None) or 'no file'}) has no attribute "
                f"{attribute_path!r}; define `def {attribute_path.rpartition('.')[2]}(response_text, row)` there "
                "or fix the name after the colon"
            )
        target = getattr(target, attribute)
    if not callable(target):
        raise RewardSpecError(
            f"{attribute_path!r} is a {type(target).__name__}, not callable (in module {module_name!r}); it must be "
            "a function reward(response_text, row) -> float"
        )
    _check_signature(target, spec)
    return target  # pyright: ignore[reportReturnType]  # the signature was bound to two positional arguments


def _import_reward_module(module_name: str, search_dirs: Sequence[Path]) -> object:
    added = [str(directory) for directory in search_dirs]
    sys.path[:0] = added
    importlib.invalidate_caches()  # a directory listed before the module file was written is read again
    try:
        return importlib.import_module(module_name)
    except ModuleNotFoundError as error:
        missing = error.name or ""
        if module_name == missing or module_name.startswith(missing + "."):  # the module itself, or its package
            raise RewardModuleNotFoundError(module_name, f"ModuleNotFoundError: {error}") from None
        raise RewardSpecError(_failed_import(module_name, error)) from error
    # Importing the user's module runs arbitrary code: whatever it raises is a mistake in the config's module, to
    # be reported in one line before any process starts, not a crash of the trainer.
    except Exception as error:
        raise RewardSpecError(_failed_import(module_name, error)) from error
    finally:
        for entry in added:
            sys.path.remove(entry)  # the first occurrence: ours, at the front


def _failed_import(module_name: str, error: BaseException) -> str:
    first_line = (str(error).splitlines() or [""])[0]
    return (
        f"importing module {module_name!r} raised {type(error).__name__}: {first_line}; fix the module (or install "
        "what it imports)"
    )


def _check_signature(function: Callable[..., object], spec: str) -> None:
    """RewardSpecError unless `function` can be called as function(response_text, row)."""
    try:
        signature = inspect.signature(function)
    except (TypeError, ValueError):  # some C callables carry no signature: their first call is their check
        return
    try:
        signature.bind("response text", {})
    except TypeError as error:
        raise RewardSpecError(
            f"{spec!r} has the signature {signature} and cannot be called as reward(response_text, row) ({error}); "
            "it must accept two positional arguments: the generated text and the data row"
        ) from None
