"""The `asyncppo` command: parses arguments and dispatches to the subcommands in this package.

    asyncppo config show CONFIG [key=value ...]   print the resolved config
    asyncppo config check CONFIG [key=value ...] [--run-dir DIR]  the load rules and train's pre-flight (see api.py)
    asyncppo config keys [PREFIX]                 list every config key with its meaning
    asyncppo config port NEMO_RL.yaml [-o OUT]    port a NeMo-RL PPO or GRPO config (cli/config_port.py)
    asyncppo train CONFIG [key=value ...] [--resume-from CHECKPOINT]  train (see cli/train.py); a NeMo-RL config
                                                  is ported first
    asyncppo gym serve CONFIG [key=value ...]     serve the policy and the built-in gym (see cli/gym_serve.py)
    asyncppo bench generate CONFIG [key=value ...]  time generation alone (see cli/bench_generate.py)
    asyncppo bench train --workload NAME --model DIR  train a named workload briefly (see cli/bench_train.py)
    asyncppo report RUN_DIR [RUN_DIR_B] [-o PATH]   write the run's HTML report; two runs are overlaid
    asyncppo critic collect|pretrain CONFIG [key=value ...]  offline critic pretraining (see cli/critic.py)

User mistakes (config errors) print one line each and exit with status 2, never a traceback. A run that started and
then stopped on a failure it reports (a failure budget ran out, a reward function failed) prints one line and exits
with status 1.
"""

import argparse
import logging
import os
import signal
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, NoReturn, TypeAlias

from asyncppo.config import ConfigError

USAGE_ERROR = 2
RUN_FAILED = 1
SIGNAL_STOP_STATUSES = (128 + signal.SIGTERM, 128 + signal.SIGINT)
"""What `asyncppo train` returns when SIGTERM (143) or SIGINT (130) stopped the run."""


GYM_SERVE_DESCRIPTION = """\
Serve a policy model and asyncppo's built-in gym environments over HTTP, to try a model, an environment or an
OpenAI-compatible client by hand. Nothing is trained. All servers listen on 127.0.0.1 only.

It reads the run config that `asyncppo train` takes and starts, in this one process:
  - the policy server: model.model_name (a local Hugging Face directory, tiny:<preset> or demo:<name>) on
    cluster.device, at http://127.0.0.1:<env.gym.policy_server_port>/v1 (0 = a free port), answering
    POST /v1/chat/completions and POST /v1/responses (OpenAI wire format; every answer carries the exact
    prompt_token_ids, generation_token_ids and generation_log_probs), GET /v1/models and POST /tokenize;
  - per built-in environment named in env.gym.resources (`asyncppo config keys env.gym.resources` lists them):
    a resources server and a simple agent, <name>_simple_agent, whose POST /run plays one dataset row (up to
    env.gym.max_steps model calls) and answers the verified result with its reward;
  - a head server listing the agents (GET /global_config_dict_yaml), for gym clients.

It prints one line per server, then `ready`, and serves until Ctrl-C or SIGTERM, then stops everything and
exits 0. Requests must send temperature and top_p equal to the training profile (generation.temperature,
generation.top_p) or the validation one (generation.val_temperature, generation.val_top_p; 0 = greedy), or
they are refused with 400: this server only samples the way training does. When env.gym.api_key is set,
send it as `Authorization: Bearer <key>` (the OpenAI clients' api_key)."""

GYM_SERVE_EPILOG = """\
example (the demo config samples with temperature 1.0, top_p 1.0):
  asyncppo gym serve examples/configs/demo.yaml env.gym.policy_server_port=8000
  # then, in Python:
  import openai
  client = openai.OpenAI(base_url="http://127.0.0.1:8000/v1", api_key="unused")
  client.responses.create(model="policy", input="What is 2+3?", temperature=1.0, top_p=1.0).output_text
"""


if TYPE_CHECKING:
    Commands: TypeAlias = argparse._SubParsersAction[argparse.ArgumentParser]  # pyright: ignore[reportPrivateUsage]  # argparse has no public name for it


def _build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="asyncppo", description="PPO post-training of language models.")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    _add_config_command(commands)
    _add_train_and_gym_commands(commands)
    _add_bench_command(commands)
    _add_report_command(commands)
    from asyncppo.cli.critic import add_critic_arguments

    add_critic_arguments(commands)
    return parser


def _add_config_command(commands: "Commands") -> None:
    config = commands.add_parser("config", help="inspect configs")
    config_commands = config.add_subparsers(dest="config_command", required=True, metavar="SUBCOMMAND")
    show = config_commands.add_parser("show", help="print the resolved config (YAML files + overrides)")
    show.add_argument("config", help="YAML run config")
    show.add_argument("overrides", nargs="*", metavar="key=value", help="dotted overrides, e.g. ppo.ppo_epochs=2")
    check = config_commands.add_parser(
        "check",
        help="check what `train` checks before it starts (config rules, data, reward function, run directory); "
        "one `ok:` line and exit 0, or one `error:` line per problem and exit 2",
    )
    check.add_argument("config", help="YAML run config (asyncppo's, or a NeMo-RL PPO or GRPO config, ported first)")
    check.add_argument("overrides", nargs="*", metavar="key=value", help="dotted overrides, e.g. ppo.ppo_epochs=2")
    check.add_argument("--run-dir", default=None, help="run directory to check (default: logger.log_dir)")
    keys = config_commands.add_parser("keys", help="list every config key with its type, default and meaning")
    keys.add_argument("prefix", nargs="?", default="", help="only keys under this dotted prefix, e.g. ppo.async_ppo")
    port = config_commands.add_parser(
        "port",
        help="port a NeMo-RL PPO or GRPO config: a table of every key, and the asyncppo config (exit 2 if refused)",
    )
    from asyncppo.cli.config_port import add_arguments as add_port_arguments

    add_port_arguments(port)


def _add_train_and_gym_commands(commands: "Commands") -> None:
    train = commands.add_parser("train", help="train a policy with PPO")
    train.add_argument("config", help="YAML run config (asyncppo's, or a NeMo-RL PPO or GRPO config, ported first)")
    train.add_argument("overrides", nargs="*", metavar="key=value", help="dotted overrides, e.g. ppo.ppo_epochs=2")
    train.add_argument("--run-dir", default=None, help="run directory (default: logger.log_dir)")
    train.add_argument(
        "--resume-from",
        default=None,
        metavar="CHECKPOINT",
        help="resume from this checkpoint instead of the newest that verifies: step_N of the run's checkpoint "
        "directory, or a checkpoint directory's path (it must verify; the run's later checkpoints are set aside)",
    )

    gym = commands.add_parser("gym", help="serve a policy and gym environments over HTTP (no training)")
    gym_commands = gym.add_subparsers(dest="gym_command", required=True, metavar="SUBCOMMAND")
    serve = gym_commands.add_parser(
        "serve",
        help="serve the config's policy model and the built-in gym environments until Ctrl-C",
        description=GYM_SERVE_DESCRIPTION,
        epilog=GYM_SERVE_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    serve.add_argument("config", help="YAML run config (the one `asyncppo train` takes)")
    serve.add_argument("overrides", nargs="*", metavar="key=value", help="dotted overrides, e.g. env.gym.max_steps=4")


def _add_bench_command(commands: "Commands") -> None:
    bench = commands.add_parser("bench", help="benchmarks")
    bench_commands = bench.add_subparsers(dest="bench_command", required=True, metavar="SUBCOMMAND")
    generate = bench_commands.add_parser(
        "generate",
        help="time generation alone (tok/s, ms per decode step against the memory floor), one row per case",
    )
    from asyncppo.cli.bench_generate import add_arguments

    add_arguments(generate)
    bench_train = bench_commands.add_parser(
        "train",
        help="train a named workload (trl, longtail) for a few steps: phases, tokens/s, MFU, mismatch, memory",
    )
    from asyncppo.cli.bench_train import add_arguments as add_bench_train_arguments

    add_bench_train_arguments(bench_train)


def _add_report_command(commands: "Commands") -> None:
    report = commands.add_parser(
        "report",
        help="write a self-contained HTML report of a run (curves, timings, config); two runs are overlaid",
    )
    report.add_argument("run_dirs", nargs="+", metavar="RUN_DIR", help="run directory; a second one is overlaid")
    report.add_argument(
        "-o",
        "--output",
        default=None,
        help="HTML file to write (default: RUN_DIR/report.html; with two runs RUN_DIR/report_vs_<B>.html)",
    )


def _printable(text: str) -> str:
    """`text` with control characters and lone surrogates escaped: a message quoting a key or value from the user
    stays on one line and encodes on any stderr."""
    return "".join(char if char.isprintable() else repr(char)[1:-1] for char in text)


def _run_failure_line(error: Exception) -> str | None:
    """The one line of a failure that ends a run by design, which says all there is to say (the step, the budget's
    key, the failing group, the function and the row); None for anything else, which keeps its traceback."""
    # Imported here: the rewards module brings math-verify (sympy), which the other commands never need.
    from asyncppo.pipeline.errors import CollectorError, RunEndingError, StepFillError
    from asyncppo.rollout.rewards import RewardFunctionError

    budget_ran_out = isinstance(error, CollectorError) and isinstance(error.__cause__, StepFillError)
    # RunEndingError: a worker process died (a trainer, or a generator past generation.max_restarts).
    if isinstance(error, StepFillError | RewardFunctionError | RunEndingError) or budget_ran_out:
        return str(error)
    return None


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the console script; returns the process exit status."""
    parser = _build_parser()
    # Overrides may also follow options (`train run.yaml --run-dir d ppo.ppo_epochs=2`): argparse stops filling a
    # positional list at the first option, so key=value words left over are appended to the overrides.
    args, leftover = parser.parse_known_args(argv)
    stray = [word for word in leftover if word.startswith("-") or "=" not in word or not hasattr(args, "overrides")]
    if stray:
        parser.error(f"unrecognized arguments: {' '.join(stray)}")
    if leftover:
        args.overrides = [*args.overrides, *leftover]
    try:
        if args.command == "config":
            from asyncppo.cli.config_commands import run_config_command

            return run_config_command(args)
        if args.command == "train":
            from asyncppo.cli.train import run_train_command

            return run_train_command(args)
        if args.command == "gym":
            from asyncppo.cli.gym_serve import run_gym_serve_command

            return run_gym_serve_command(args)
        if args.command == "bench" and args.bench_command == "train":
            from asyncppo.cli.bench_train import run_bench_train_command

            return run_bench_train_command(args)
        if args.command == "bench":
            from asyncppo.cli.bench_generate import run_bench_generate_command

            return run_bench_generate_command(args)
        if args.command == "report":
            from asyncppo.cli.report import run_report_command

            return run_report_command(args)
        if args.command == "critic":
            from asyncppo.cli.critic import run_critic_command

            return run_critic_command(args)
    except ConfigError as error:
        for line in error.lines:
            print(f"error: {_printable(line)}", file=sys.stderr)
        return USAGE_ERROR
    except Exception as error:
        line = _run_failure_line(error)
        if line is None:
            raise
        print(f"error: {_printable(line)}", file=sys.stderr)
        return RUN_FAILED
    raise AssertionError(f"unhandled command {args.command!r}")


def run_as_program() -> NoReturn:
    """The `asyncppo` program (console script and `python -m asyncppo`): main() on sys.argv, then exit with its
    status.

    A run that a signal stopped has stopped everything it started and printed its line by now, and ends here at
    once (os._exit, after flushing), not through the interpreter's teardown. Our handler's KeyboardInterrupt may
    have passed through a nested PyRun_* call of some library's native code (pybind11's exec, while torch or
    Ray imports): CPython then remembers an "unhandled" KeyboardInterrupt, and `python -m` ends such a process by
    SIGINT after its teardown, whatever status it was given. The chaos harness saw it in 2 of 12 start-up stops
    (the stop line, then status -2 instead of 143). A later SIGTERM or SIGINT changes nothing either."""
    status = main()
    if status in SIGNAL_STOP_STATUSES:
        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, signal.SIG_IGN)
        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(status)
    sys.exit(status)


if __name__ == "__main__":
    run_as_program()
