"""The `asyncppo` command: parses arguments and dispatches to the subcommands in this package.

    asyncppo config show CONFIG [key=value ...]   print the resolved config
    asyncppo config keys [PREFIX]                 list every config key with its meaning
    asyncppo train CONFIG [key=value ...]         train (see cli/train.py)

User mistakes (config errors) print one line each and exit with status 2, never a traceback.
"""

import argparse
import sys
from collections.abc import Sequence

from asyncppo.config import ConfigError

USAGE_ERROR = 2


def _build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="asyncppo", description="PPO post-training of language models.")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    config = commands.add_parser("config", help="inspect configs")
    config_commands = config.add_subparsers(dest="config_command", required=True, metavar="SUBCOMMAND")
    show = config_commands.add_parser("show", help="print the resolved config (YAML files + overrides)")
    show.add_argument("config", help="YAML run config")
    show.add_argument("overrides", nargs="*", metavar="key=value", help="dotted overrides, e.g. ppo.ppo_epochs=2")
    keys = config_commands.add_parser("keys", help="list every config key with its type, default and meaning")
    keys.add_argument("prefix", nargs="?", default="", help="only keys under this dotted prefix, e.g. ppo.async_ppo")

    train = commands.add_parser("train", help="train a policy with PPO")
    train.add_argument("config", help="YAML run config")
    train.add_argument("overrides", nargs="*", metavar="key=value", help="dotted overrides, e.g. ppo.ppo_epochs=2")
    train.add_argument("--run-dir", default=None, help="run directory (default: logger.log_dir)")
    return parser


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
    except ConfigError as error:
        for line in error.lines:
            print(f"error: {line}", file=sys.stderr)
        return USAGE_ERROR
    raise AssertionError(f"unhandled command {args.command!r}")


if __name__ == "__main__":
    sys.exit(main())
