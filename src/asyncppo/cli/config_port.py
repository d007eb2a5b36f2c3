"""`asyncppo config port NEMO_RL.yaml [-o OUT.yaml]`: a NeMo-RL PPO or GRPO config as an asyncppo config.

The table (one row per input key: mapped, neutral, backend or refused) goes to stdout when the config is written
to a file, to stderr when the config itself goes to stdout (so `> out.yaml` captures only the config). A refused
key or a ported config that fails validation exits 2 with `error:` lines and writes nothing.
"""

import argparse
import sys
from pathlib import Path

from asyncppo.config import ConfigError, validate_tree
from asyncppo.config.nemo_rl import checked_tree, dump_tree, format_table, port_file


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The `config port` arguments."""
    parser.add_argument("config", help="NeMo-RL PPO or GRPO config (YAML; `defaults:` and ${...} are resolved)")
    parser.add_argument("-o", "--output", default=None, help="asyncppo config to write (default: stdout)")


def run_config_port_command(args: argparse.Namespace) -> int:
    """Port, print the table, validate, write the asyncppo config."""
    result = port_file(args.config)
    table_stream = sys.stdout if args.output else sys.stderr
    print(format_table(result.rows), file=table_stream, flush=True)
    tree = checked_tree(result)
    validate_tree(tree)
    text = dump_tree(tree)
    if args.output is None:
        print(text, end="")
        return 0
    try:
        Path(args.output).write_text(text, encoding="utf-8")
    except OSError as error:
        raise ConfigError([f"{args.output}: cannot write the ported config ({error.strerror})"]) from None
    print(f"wrote {args.output}")
    return 0
