"""`asyncppo config show` and `asyncppo config keys`."""

import argparse

from pydantic_core import PydanticUndefined

from asyncppo.config import RunConfig, dump_config, load_config
from asyncppo.config.schema_walk import iter_keys


def _describe_default(default: object) -> str:
    return "required" if default is PydanticUndefined else f"default {default!r}"


def run_config_command(args: argparse.Namespace) -> int:
    """Print the resolved config, or the documented list of keys."""
    if args.config_command == "show":
        print(dump_config(load_config(args.config, args.overrides)), end="")
        return 0
    for path, info in iter_keys(RunConfig):
        if not path.startswith(args.prefix):
            continue
        description = " ".join((info.description or "").split())
        print(f"{path} ({_describe_default(info.default)}): {description}")
    return 0
