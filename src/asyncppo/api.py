"""The Python API, `asyncppo.load_config`, `asyncppo.check` and `asyncppo.train`; `asyncppo config check` and
`asyncppo train` (cli/) are these functions behind a command line.

    path + overrides --load_config--> RunConfig --check (pre-flight)--> CheckedRun --train--> TrainResult
                      load rules,                  data rows, reward          resolve_setup, the run,
                      NeMo-RL ported                function, run directory    its report; Ray down if ours

Everything up to the end of `check` runs without torch, transformers or Ray (it answers in about a second, where
importing them takes 10 s or more on a busy machine); `train` imports the trainer only once the checks pass. Every
mistake in the config or the run's inputs is a ConfigError holding one self-contained line per problem (`.lines`),
which the CLI prints as `error: ...` and exits 2.
"""

import os
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from asyncppo.config import ConfigError, RunConfig
from asyncppo.config.nemo_rl.port import load_run_config

if TYPE_CHECKING:
    from asyncppo.trainer.preflight import CheckedInputs
    from asyncppo.trainer.stop_signals import SignalStop

Overrides = Mapping[str, object] | Sequence[str] | None
"""Dotted keys to values (`{"ppo.max_num_steps": 2}`), or the command line's `key=value` strings."""
ConfigSource = RunConfig | str | os.PathLike[str]
"""A validated config, or the path of a YAML run config (asyncppo's, or a NeMo-RL PPO or GRPO config, ported)."""


def load_config(path: str | os.PathLike[str], overrides: Overrides = None) -> RunConfig:
    """The validated, frozen config of the YAML file at `path` with `overrides` applied, as `asyncppo train` loads
    it: `defaults:` files merged, a NeMo-RL PPO or GRPO config ported (its table printed), every load rule checked.

    An override's value may be any YAML-able value (`2`, `1e-4`, `None`, `[5, 7]`, a dict); a string is read the way
    the command line reads `key=value` text (`"2"` is the number for an int key). ConfigError lists each problem.
    """
    return load_run_config(_config_file(path), override_strings(overrides))


def override_strings(overrides: Overrides) -> list[str]:
    """`overrides` as the command line's `key=value` strings; a dict's values are written as YAML, which the loader
    reads back as the same values."""
    if overrides is None:
        return []
    if isinstance(overrides, str):
        raise ConfigError(
            [
                f"overrides: got the string {overrides!r}; expected a dict of dotted keys to values or a list of "
                "'key=value' strings"
            ]
        )
    if not isinstance(overrides, Mapping):
        strings = list(overrides)
        wrong = [item for item in strings if not isinstance(item, str)]
        if wrong:
            raise ConfigError([f"overrides: {wrong[0]!r} is not a 'key=value' string"])
        return strings
    return [f"{key}={_yaml_text(key, value)}" for key, value in overrides.items()]


def _yaml_text(key: object, value: object) -> str:
    if not isinstance(key, str):
        raise ConfigError([f"overrides: the key {key!r} is not a string; expected a dotted key like 'ppo.ppo_epochs'"])
    if isinstance(value, str):
        return value
    if isinstance(value, os.PathLike):
        return os.fspath(value)  # pyright: ignore[reportUnknownArgumentType]  # a path's text, whatever its type
    try:
        text = yaml.safe_dump(value, default_flow_style=True, width=sys.maxsize)
    except yaml.YAMLError:
        raise ConfigError(
            [
                f"{key}: {value!r} (a {type(value).__name__}) is not a config value; expected a number, a bool, "
                "None, a string, or a list or dict of those"
            ]
        ) from None
    return text.removesuffix("\n...\n").removesuffix("\n")  # PyYAML ends a lone scalar with a document-end mark


def _config_file(path: object) -> Path:
    if not isinstance(path, str | os.PathLike):
        raise ConfigError([f"config: got a {type(path).__name__}; expected a RunConfig or a YAML file's path"])
    return Path(path)  # pyright: ignore[reportUnknownArgumentType]  # str or PathLike[str], checked above


@dataclass(frozen=True)
class CheckedRun:
    """A config whose pre-flight passed: what `train` would start from."""

    config: RunConfig
    run_dir: Path
    config_dir: Path | None
    """Searched (before the working directory) for a `module:function` reward's module."""
    inputs: "CheckedInputs"
    """The rows and reward function the pre-flight loaded; the run uses them as they are."""

    def summary(self) -> str:
        """One line: rows, how rollouts are scored, the run directory."""
        inputs = self.inputs
        scoring = "scored by the gym" if inputs.reward_function is None else f"reward {self.config.env.reward_function}"
        return (
            f"{len(inputs.train_rows)} training rows, {len(inputs.validation_rows)} validation rows, {scoring}, "
            f"run directory {self.run_dir}"
        )


def check(
    config: ConfigSource,
    *,
    overrides: Overrides = None,
    run_dir: str | os.PathLike[str] | None = None,
    config_dir: str | os.PathLike[str] | None = None,
) -> CheckedRun:
    """Load `config` (a path; a RunConfig is taken as it is) and run the pre-flight: optional sink packages, the
    reward function's import and signature, the data files and rows, and that `run_dir` (default logger.log_dir)
    can be created and written. Imports no torch, transformers or Ray; ConfigError lists every problem found.

    `config_dir` is searched, before the working directory, for a `module:function` reward's module; it defaults to
    the config file's directory (none for a RunConfig).
    """
    if isinstance(config, RunConfig):
        if overrides:
            raise ConfigError(
                ["overrides: a RunConfig is already validated; give them to load_config (or pass the file's path)"]
            )
        loaded = config
    else:
        path = _config_file(config)
        loaded = load_config(path, overrides)
        config_dir = path.resolve().parent if config_dir is None else config_dir
    # Imported once the config has loaded: the built-in rewards' math-verify brings sympy (~0.5 s of imports), and a
    # mistyped key is reported without waiting for it.
    from asyncppo.trainer.preflight import preflight

    directory = Path(run_dir if run_dir is not None else loaded.logger.log_dir)
    found_in = None if config_dir is None else Path(config_dir)
    return CheckedRun(loaded, directory, found_in, preflight(loaded, found_in, directory))


@dataclass(frozen=True)
class TrainResult:
    """How a run that `train` started ended (an error in it raises instead)."""

    run_dir: Path
    """The run directory, absolute."""
    exit_status: int
    """0 when the run trained all its steps; 143 or 130 when SIGTERM or SIGINT (Ctrl-C) stopped it, after a checkpoint
    of the step in progress or while it was starting (what `asyncppo train` exits with)."""
    stopped: str | None
    """None when the run finished; else one line: the signal, the last step and the checkpoint a rerun resumes (or
    that the run was still starting)."""
    metrics: list[dict[str, Any]]
    """The records of `metrics.jsonl`, one per logged step in step order (`step` key), earlier attempts of a resumed
    run included; empty when no step was logged, or when a signal stopped the run while it was starting."""
    report: Path | None
    """The run report (report.html), or None when it could not be written (a `warning:` line said why) or the run
    never began training (a signal stopped it while it was starting)."""

    @property
    def finished(self) -> bool:
        """Whether the run trained all its steps (no signal stopped it)."""
        return self.exit_status == 0

    @property
    def last_metrics(self) -> dict[str, Any]:
        """The last logged step's record (`train/reward_mean`, `val/reward_mean`, ...); {} when none was logged."""
        return self.metrics[-1] if self.metrics else {}


def train(
    config: ConfigSource,
    *,
    overrides: Overrides = None,
    run_dir: str | os.PathLike[str] | None = None,
    config_dir: str | os.PathLike[str] | None = None,
    resume_from: str | os.PathLike[str] | None = None,
) -> TrainResult:
    """Check (`check`, same arguments), then train: build the run, train it until its last step or a SIGTERM /
    SIGINT, close it, write its report into the run directory. A run directory holding a checkpoint is resumed from
    its newest one that verifies; `resume_from` chooses one by hand instead (`step_N` of the run's checkpoint
    directory, or a checkpoint directory's path; it must verify, and the run's checkpoints after it are set aside).

    Call it from the main thread (the clean stop installs signal handlers, from the start: a signal while the run
    starts ends it too, with `stopped` saying so). A Ray cluster this process had already joined is used and left
    up; otherwise the run starts its own and shuts it down at the end.
    """
    # Light: the handlers are in place before the config loads and the heavy imports below begin.
    from asyncppo.trainer.stop_signals import SignalStop

    stop = SignalStop()
    checked: CheckedRun | None = None
    with stop.installed():
        try:
            checked = check(config, overrides=overrides, run_dir=run_dir, config_dir=config_dir)
            exit_status, stopped = _train_checked(checked, stop, None if resume_from is None else str(resume_from))
        except BaseException as error:
            if not stop.ended(error):  # only the handler's interrupt is a stop: anything else propagates
                raise
            exit_status, stopped = stop.exit_status, stop.interrupted_start_line()
        # Absolute: the workers write the checkpoints' weights under it, and they need not share this process's
        # working directory (a Ray cluster joined before a chdir, or other machines).
        directory = (checked.run_dir if checked is not None else _given_run_dir(config, run_dir)).absolute()
        report, metrics = None, []
        if stop.training:  # the run got as far as its loop: the report shows where it got to (after a stop too)
            from asyncppo.metrics.report import METRICS_NAME, write_report_or_warn
            from asyncppo.metrics.sinks import read_metrics_jsonl

            try:
                report = write_report_or_warn(directory)
                metrics = read_metrics_jsonl(directory / METRICS_NAME) if (directory / METRICS_NAME).is_file() else []
            except BaseException as error:
                if not stop.ended(error):  # a second signal while the report is written: the run ended anyway
                    raise
    return TrainResult(directory, exit_status, stopped, metrics, report)


def _given_run_dir(config: ConfigSource, run_dir: str | os.PathLike[str] | None) -> Path:
    """The run directory as far as it is known before the config has loaded (the working directory when not)."""
    if run_dir is not None:
        return Path(run_dir)
    return Path(config.logger.log_dir) if isinstance(config, RunConfig) else Path()


def _train_checked(checked: CheckedRun, stop: "SignalStop", resume_from: str | None) -> tuple[int, str | None]:
    """Train a checked run under `stop`: (the exit status, the line naming the signal that stopped it, or None)."""
    # Imported once the checks have passed: torch, transformers and Ray take seconds to import, and a mistake found
    # above is reported before any of that.
    from asyncppo.trainer.setup import resolve_setup
    from asyncppo.trainer.stopping import train_until_done_or_stopped
    from asyncppo.trainer.third_party_output import quiet_third_party_output

    quiet_third_party_output(checked.config.logger.verbose)
    setup = resolve_setup(checked.config, checked.config_dir, inputs=checked.inputs)
    outcome = train_until_done_or_stopped(setup, checked.run_dir.absolute(), stop, resume_from)
    return outcome.exit_status, outcome.stopped_line
