"""Reward functions for single-turn rollouts: `(response_text, row) -> float`, and resolving one from a spec.

`run_single_turn_rollouts` calls them once per generation through `checked_reward`, each call on a thread of its own
under a deadline (env.reward_timeout_s): an exception, a late answer or a result that is not a finite number becomes
a RewardFunctionError naming the function and the row, which fails that prompt group. The trainer's pre-flight turns
the config's `reward_function` string into a callable with `load_reward_function` (which checks the module imports
and the signature fits).
"""

import importlib
import inspect
import logging
import math
import numbers
import re
import sys
import threading
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future, wait
from pathlib import Path
from typing import Any

try:  # optional: symbolic comparison of LaTeX / expressions (pip package `math-verify`)
    import math_verify
except ImportError:  # pragma: no cover - exercised only where the package is absent
    math_verify = None
else:
    # math-verify warns (once) that it runs without its own timeout off the main thread. In training every reward call
    # runs off it on purpose, bounded by env.reward_timeout_s instead (checked_reward), so the warning is only noise.
    for _logger_name in ("math_verify.parser", "math_verify.grader"):
        logging.getLogger(_logger_name).addFilter(lambda record: "Timeout is disabled" not in record.getMessage())

RewardFunction = Callable[[str, Mapping[str, Any]], float]

# math-verify's timeouts use signal.alarm, which only works on the main thread; elsewhere we run without one (so in
# training, where checked_reward calls every reward function on a thread of its own, env.reward_timeout_s bounds it).
_MATH_VERIFY_TIMEOUT_SECONDS = 5
_BOXED = "\\boxed{"
_NUMBER = re.compile(r"-?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?:/\d+)?|-?\.\d+")
_LATEX_FRACTION = re.compile(r"^(-?)\\[dt]?frac\{(-?[\d.]+)\}\{(-?[\d.]+)\}$")
# How much of a row a reward error quotes to name it.
_ROW_QUOTE_CHARS = 120


class RewardFunctionError(ValueError):
    """A reward function failed on one row: it raised, returned something other than a finite number, or ran past its
    deadline. The message names the function and the row (one line)."""


class RewardTimeoutError(RewardFunctionError, TimeoutError):
    """A reward function did not return within its deadline (env.reward_timeout_s)."""


def checked_reward(
    reward_fn: RewardFunction,
    response_text: str,
    row: Mapping[str, Any],
    where: str,
    timeout_s: float | None = None,
) -> float:
    """`reward_fn(response_text, row)` as a float; RewardFunctionError naming the function and the row unless it
    returns a finite int, float or bool (numpy's scalar numbers too) within `timeout_s` seconds (None: no deadline).

    `where` names the row for the message (e.g. "row 3 (prompt group 17, sample 0)"). A NaN or infinite reward would
    otherwise pass through the advantages into the loss and fail far from its cause, and a string such as "1.0" is a
    mistake in the function even where float() would read it. An exception the function raises becomes a
    RewardFunctionError with it as the cause. With a deadline the call runs on a daemon thread of its own: Python
    cannot stop a thread, so a call past the deadline is abandoned there (it runs on until it returns, its result
    discarded, and ends with the process at the latest), and the caller gets a RewardTimeoutError at the deadline.
    """
    try:
        if timeout_s is None:
            value = reward_fn(response_text, row)
        else:
            value = _call_with_deadline(reward_fn, response_text, row, timeout_s)
    except _Deadline:
        raise RewardTimeoutError(
            f"reward function {_name(reward_fn)} did not return within env.reward_timeout_s={timeout_s} s for {where} "
            f"(the call is abandoned on its thread); row: {_quote(row)}"
        ) from None
    except Exception as error:  # the user's function: whatever it raises fails this row's group, named
        raise _failure(reward_fn, f"raised {_one_line(error)}", where, row) from error
    if isinstance(value, numbers.Real):  # int, float, bool, Fraction, numpy's scalars; not str, None or arrays
        try:
            reward = float(value)
        except OverflowError:  # an int beyond float's range
            reward = math.inf
        if math.isfinite(reward):
            return reward
    returned = f"returned {_quote(value, 60)} (a {type(value).__name__})"
    raise _failure(reward_fn, returned, where, row, ", expected a finite number (int, float or bool)")


class _Deadline(Exception):
    """The deadline of `_call_with_deadline` passed."""


def _call_with_deadline(reward_fn: RewardFunction, response_text: str, row: Mapping[str, Any], timeout_s: float) -> Any:
    """`reward_fn(response_text, row)` on a daemon thread: its result or its exception, or _Deadline after
    `timeout_s` seconds."""
    outcome: Future[Any] = Future()

    def call() -> None:
        try:
            outcome.set_result(reward_fn(response_text, row))
        except BaseException as error:  # handed to the caller's thread, which raises it there
            outcome.set_exception(error)

    threading.Thread(target=call, name=f"reward {_name(reward_fn)}", daemon=True).start()
    finished, _ = wait([outcome], timeout=timeout_s)
    if not finished:
        raise _Deadline
    return outcome.result()


def _failure(
    reward_fn: RewardFunction, what: str, where: str, row: Mapping[str, Any], expected: str = ""
) -> RewardFunctionError:
    return RewardFunctionError(f"reward function {_name(reward_fn)} {what} for {where}{expected}; row: {_quote(row)}")


def _name(reward_fn: RewardFunction) -> str:
    """`module.qualname` of a function; the repr of other callables (a partial, an object with __call__)."""
    qualname = getattr(reward_fn, "__qualname__", None)
    if qualname is None:
        return _quote(reward_fn, 80)
    return f"{getattr(reward_fn, '__module__', '?')}.{qualname}"


def _one_line(error: BaseException) -> str:
    """`Type: message`, the message on one line and shortened."""
    message = _quote_text(str(error), _ROW_QUOTE_CHARS)
    return f"{type(error).__name__}: {message}" if message else type(error).__name__


def _quote(value: object, limit: int = _ROW_QUOTE_CHARS) -> str:
    """repr(value) on one line (a row: the dict's repr), cut at `limit` characters."""
    return _quote_text(repr(dict(value) if isinstance(value, Mapping) else value), limit)


def _quote_text(text: str, limit: int) -> str:
    one_line = " ".join(text.split())  # numpy arrays and tracebacks print over several lines
    return one_line if len(one_line) <= limit else one_line[:limit] + "..."


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
