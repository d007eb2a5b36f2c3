"""Pre-flight: everything about a run that can be checked before any process starts, checked first.

`build_run` calls `preflight` before it writes anything or starts Ray. Each mistake becomes one line of a
ConfigError, `<key path>: <problem>; <what to do>` (the CLI prints it as `error: ...` and exits 2):

    logger.wandb_enabled / mlflow_enabled  the optional package is installed
    env.reward_function                    the module imports, the function exists and takes (response_text, row)
    data.*                                 files exist, parse, hold rows, and the rows have the prompt field
    data.max_new_tokens_key                every row holds valid response budgets (when the key is set)

The independent checks all run, so one attempt reports every mistake. What they load (rows, the reward function)
is returned for the build to use, so nothing is loaded twice. The scheduler's warmup is fitted to the run's
length when the config is validated (config/schema.py), earlier still.
"""

import importlib.util
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from asyncppo.config import ConfigError, RunConfig
from asyncppo.data.rows import MissingPromptFieldError, load_gym_rows, load_rows, split_rows
from asyncppo.rollout.rewards import RewardFunction, RewardModuleNotFoundError, RewardSpecError, load_reward_function
from asyncppo.rollout.single_turn import row_token_budgets

T = TypeVar("T")


@dataclass(frozen=True)
class CheckedInputs:
    """What the pre-flight loaded: the data rows and, for reward-function runs, the reward function."""

    train_rows: list[dict[str, Any]]
    validation_rows: list[dict[str, Any]]
    reward_function: RewardFunction | None
    """None for gym runs (the environment scores)."""


def preflight(config: RunConfig, config_dir: Path | None = None) -> CheckedInputs:
    """Check sinks, reward function and data; ConfigError with one line per mistake found.

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
    """(train rows, validation rows) of data.train_path and data.validation_path (else split off the training
    rows); a missing, empty or malformed file, or a row without the prompt field, is a ConfigError naming the key.

    Relative paths resolve from the working directory (the process's, not the config file's).
    """
    data = config.data

    def load(key: str, path: str) -> list[dict[str, Any]]:
        if not Path(path).exists():
            raise ConfigError(
                [
                    f"{key}: {path!r} does not exist (relative paths resolve from the working directory {Path.cwd()}); "
                    "give the path of a .jsonl file or of a datasets save_to_disk directory"
                ]
            )
        try:
            if config.env.should_use_nemo_gym:
                rows = load_gym_rows(path)
            else:
                rows = load_rows(path, prompt_key=data.prompt_key, messages_key=data.messages_key)
        except MissingPromptFieldError as error:
            raise ConfigError(
                [
                    f"data.prompt_key: {error.where} has neither the prompt field {data.prompt_key!r} "
                    f"(data.prompt_key) nor the chat field {data.messages_key!r} (data.messages_key), only "
                    f"{error.fields}; set data.prompt_key or data.messages_key to the field that holds the prompt"
                ]
            ) from None
        except (ValueError, OSError) as error:
            raise ConfigError([f"{key}: {error}; fix the file or point {key} at another"]) from None
        if not rows:
            raise ConfigError([f"{key}: {path} holds no rows; expected one JSON object per line (with a prompt field)"])
        return rows

    rows = load("data.train_path", data.train_path)
    if data.validation_path is not None:
        return rows, load("data.validation_path", data.validation_path)
    try:
        return split_rows(rows, data.validation_fraction, config.ppo.seed)
    except ValueError as error:
        raise ConfigError([f"data.validation_fraction: {error}; lower it or add training rows"]) from None
