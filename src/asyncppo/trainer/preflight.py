"""Pre-flight: everything about a run that can be checked before any process starts, checked first.

`asyncppo train` and `asyncppo config check` (through api.py) call `preflight` before torch, transformers or Ray
are imported, and hand the result to `resolve_setup`; `build_run` lets `resolve_setup` call it. Nothing is written
and no process starts before it passes. Each mistake becomes one line of a ConfigError, `<key path>: <problem>;
<what to do>` (the CLI prints it as `error: ...` and exits 2):

    logger.wandb_enabled / mlflow_enabled  the optional package is installed
    env.reward_function                    the module imports, the function exists and takes (response_text, row)
    data.*                                 files or Hub datasets exist, parse, hold rows, and the rows have the
                                           prompt field; prompt files hold usable text
    data.max_new_tokens_key                every row holds valid response budgets (when the key is set)
    logger.log_dir / the run directory     it is (or can be created as) a directory this process can write in

The independent checks all run, so one attempt reports every mistake. What they load (rows, the reward function)
is returned for the build to use, so nothing is loaded twice. The scheduler's warmup is fitted to the run's
length when the config is validated (config/schema.py), earlier still. This module and its imports stay free of
torch, transformers and Ray (tests/cli/test_early_errors.py): a user's reward module may import them itself.
"""

import importlib.util
import os
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from asyncppo.config import ConfigError, RunConfig
from asyncppo.data.hub import HubSplit, load_hub_split, training_split, validation_split
from asyncppo.data.prompt_files import prompt_texts
from asyncppo.data.response_budgets import row_token_budgets
from asyncppo.data.rows import (
    MissingAnswerMarkerError,
    MissingPromptFieldError,
    canonical_rows,
    check_gym_rows,
    copy_answer_field,
    load_gym_rows,
    load_rows,
    split_rows,
)
from asyncppo.rollout.rewards import RewardFunction, RewardModuleNotFoundError, RewardSpecError, load_reward_function

T = TypeVar("T")


@dataclass(frozen=True)
class CheckedInputs:
    """What the pre-flight loaded: the data rows and, for reward-function runs, the reward function."""

    train_rows: list[dict[str, Any]]
    validation_rows: list[dict[str, Any]]
    reward_function: RewardFunction | None
    """None for gym runs (the environment scores)."""


def preflight(config: RunConfig, config_dir: Path | None = None, run_dir: Path | None = None) -> CheckedInputs:
    """Check sinks, reward function, data and (when `run_dir` is given) the run directory; ConfigError with one
    line per mistake found.

    `config_dir` is the directory of the config file the run came from (None when it came from elsewhere): it
    and the working directory are searched first for the reward function's module.
    """
    problems: list[str] = []

    def checked(check: Callable[[], T]) -> T | None:
        try:
            return check()
        except ConfigError as error:
            problems.extend(error.lines)
            return None

    checked(lambda: check_optional_packages(config))
    reward = None
    if not config.env.should_use_nemo_gym:
        reward = checked(lambda: check_reward_function(config.env.reward_function, config_dir))
    data = checked(lambda: load_data(config))
    if data is not None:
        checked(lambda: check_response_budgets(config, *data))
    if run_dir is not None:
        checked(lambda: check_run_directory(run_dir, config.logger.log_dir))
    if problems:
        raise ConfigError(problems)
    assert data is not None
    return CheckedInputs(data[0], data[1], reward)


OPTIONAL_SINK_PACKAGES = (("logger.wandb_enabled", "wandb"), ("logger.mlflow_enabled", "mlflow"))
"""(the key that enables a remote sink, the package it imports); each is also an extra of asyncppo."""


def check_optional_packages(config: RunConfig) -> None:
    """ConfigError naming each enabled sink whose package is not installed."""
    enabled = {
        "logger.wandb_enabled": config.logger.wandb_enabled,
        "logger.mlflow_enabled": config.logger.mlflow_enabled,
    }
    missing = [
        f"{key}: true needs the {package!r} package, which is not installed; `pip install {package}` (or the "
        f"extra: `pip install 'asyncppo[{package}]'`), or set {key}: false"
        for key, package in OPTIONAL_SINK_PACKAGES
        if enabled[key] and importlib.util.find_spec(package) is None
    ]
    if missing:
        raise ConfigError(missing)


def check_response_budgets(
    config: RunConfig, train_rows: list[dict[str, Any]], validation_rows: list[dict[str, Any]]
) -> None:
    """ConfigError naming the first training and the first validation row whose data.max_new_tokens_key field is
    missing or malformed (the rollouts would fail on it mid-run); nothing to check when the key is null."""
    key = config.data.max_new_tokens_key
    if key is None:
        return
    ppo = config.ppo
    problems: list[str] = []
    for rows, name, generations in (
        (train_rows, "training", ppo.num_generations_per_prompt),
        (validation_rows, "validation", ppo.val_num_generations_per_prompt),
    ):
        for index, row in enumerate(rows):
            try:
                row_token_budgets(row, f"{name} row {index}", key, generations)
            except ValueError as error:
                problems.append(f"data.max_new_tokens_key: {error}")
                break
    if problems:
        raise ConfigError(problems)


def check_run_directory(run_dir: Path, log_dir: str) -> None:
    """ConfigError unless `run_dir` is a directory this process can write in, or one it can create.

    The check makes what is missing of `run_dir` and an empty probe directory in it, then removes all it made: only
    a real attempt answers for every way a write can fail (permissions that root ignores, read-only or virtual file
    systems such as /proc, quotas, a name too long for the file system).
    """
    key = "logger.log_dir" if Path(log_dir) == run_dir else "run directory"
    if "\0" in str(run_dir):
        raise ConfigError([f"{key}: {str(run_dir)!r} holds a NUL character; expected a directory's path"])
    existing, missing = run_dir, list[Path]()
    while not os.path.lexists(existing) and existing != existing.parent:
        missing.append(existing)
        existing = existing.parent
    if not existing.is_dir():
        place = "is" if existing == run_dir else f"lies under {str(existing)!r}, which is"
        what = "a symbolic link to nothing (a loop, or a missing target)" if existing.is_symlink() else "a file"
        raise ConfigError(
            [f"{key}: {str(run_dir)!r} {place} {what}; expected a directory, or a path where one can be made"]
        )
    made: list[Path] = []
    try:
        try:
            for directory in reversed(missing):
                directory.mkdir()
                made.append(directory)
            os.rmdir(tempfile.mkdtemp(prefix=".asyncppo-write-check-", dir=run_dir))
        finally:
            for directory in reversed(made):
                directory.rmdir()
    except OSError as error:
        where = "in it" if existing == run_dir else f"in {str(existing)!r}, where it would be created"
        raise ConfigError(
            [
                f"{key}: {str(run_dir)!r} is not writable: cannot create a directory {where} "
                f"({error.strerror or error}); choose a directory this process can write in"
            ]
        ) from None


def check_reward_function(spec: str, config_dir: Path | None) -> RewardFunction:
    """The function env.reward_function names, imported with the config's directory and the working directory
    in front of the import path; ConfigError when it does not import or cannot take (response_text, row)."""
    key = "env.reward_function"
    working_dir = Path.cwd()
    search_dirs = [working_dir] if config_dir is None else [config_dir, working_dir]
    try:
        return load_reward_function(spec, search_dirs)
    except RewardModuleNotFoundError as error:
        searched = (
            f"the working directory {working_dir} is"
            if config_dir is None
            else f"the config's directory {config_dir} and the working directory {working_dir} are"
        )
        module_file = error.module_name.replace(".", "/") + ".py"
        raise ConfigError(
            [
                f"{key}: cannot import module {error.module_name!r} ({error.detail}); {searched} on the import "
                f"path: put {module_file} there, or install the module"
            ]
        ) from None
    except RewardSpecError as error:
        raise ConfigError([f"{key}: {error}"]) from None


def load_data(config: RunConfig) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(train rows, validation rows): training rows from data.train_path or the Hub dataset data.dataset
    (data/hub.py); validation rows from data.validation_path, else data.validation_split (of
    data.validation_dataset or data.dataset), else split off the training rows; data.answer_key copied to each
    row's `answer`. A missing, empty or malformed file or dataset, a row without the prompt field, or a prompt
    file that cannot be used (data/prompt_files.py) is a ConfigError naming the key.

    Relative paths resolve from the working directory (the process's, not the config file's).
    """
    data = config.data
    gym = config.env.should_use_nemo_gym

    def load(key: str, path: str) -> list[dict[str, Any]]:
        if not Path(path).exists():
            raise ConfigError(
                [
                    f"{key}: {path!r} does not exist (relative paths resolve from the working directory {Path.cwd()}); "
                    "give the path of a .jsonl file or of a datasets save_to_disk directory"
                ]
            )
        try:
            if gym:
                rows = load_gym_rows(path)
            else:
                rows = load_rows(path, prompt_key=data.prompt_key, messages_key=data.messages_key)
        except MissingPromptFieldError as error:
            raise missing_prompt_field(config, error) from None
        except (ValueError, OSError) as error:
            raise ConfigError([f"{key}: {error}; fix the file or point {key} at another"]) from None
        if not rows:
            raise ConfigError([f"{key}: {path} holds no rows; expected one JSON object per line (with a prompt field)"])
        return with_answers(config, rows, [f"{path} row {index}" for index in range(len(rows))])

    prompt_texts(data, gym)  # checked here, before any process starts; single-turn rollouts read them again
    training = training_split(data)
    if training is not None:
        rows = load_hub_rows(config, training)
    else:
        assert data.train_path is not None, "the data section's rules require data.train_path or data.dataset"
        rows = load("data.train_path", data.train_path)
    if data.validation_path is not None:
        return rows, load("data.validation_path", data.validation_path)
    validation = validation_split(data)
    if validation is not None:
        return rows, load_hub_rows(config, validation)
    try:
        return split_rows(rows, data.validation_fraction, config.ppo.seed)
    except ValueError as error:
        raise ConfigError([f"data.validation_fraction: {error}; lower it or add training rows"]) from None


def load_hub_rows(config: RunConfig, source: HubSplit) -> list[dict[str, Any]]:
    """The rows of a Hub dataset split, checked as file rows are (prompt field or gym input), with answers."""
    data = config.data
    raw_rows, where = load_hub_split(source)
    try:
        if config.env.should_use_nemo_gym:
            rows = check_gym_rows(raw_rows, where)
        else:
            rows = canonical_rows(raw_rows, where, data.prompt_key, data.messages_key)
    except MissingPromptFieldError as error:
        raise missing_prompt_field(config, error) from None
    except ValueError as error:
        raise ConfigError([f"{source.dataset_key}: {error}"]) from None
    return with_answers(config, rows, where)


def missing_prompt_field(config: RunConfig, error: MissingPromptFieldError) -> ConfigError:
    """The error line of a row without the prompt field."""
    data = config.data
    return ConfigError(
        [
            f"data.prompt_key: {error.where} has neither the prompt field {data.prompt_key!r} "
            f"(data.prompt_key) nor the chat field {data.messages_key!r} (data.messages_key), only "
            f"{error.fields}; set data.prompt_key or data.messages_key to the field that holds the prompt"
        ]
    )


def with_answers(config: RunConfig, rows: list[dict[str, Any]], where: list[str]) -> list[dict[str, Any]]:
    """`rows` with data.answer_key copied to `answer` and cut at data.answer_marker (unchanged when both are
    null)."""
    data = config.data
    if data.answer_key is None and data.answer_marker is None:
        return rows
    try:
        return copy_answer_field(rows, data.answer_key, where, data.answer_marker)
    except MissingAnswerMarkerError as error:
        raise ConfigError(
            [f"data.answer_marker: {error}; set data.answer_marker to the text before every row's final answer"]
        ) from None
    except ValueError as error:
        raise ConfigError([f"data.answer_key: {error}; set data.answer_key to a field every row has"]) from None
