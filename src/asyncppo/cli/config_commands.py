"""`asyncppo config show`, `config check` and `config keys` (`config port` is in cli/config_port.py).

`config check` is `asyncppo.check` (api.py): the load rules and the pre-flight that `asyncppo train` runs before it
imports torch, so it answers in about a second.
"""

import argparse

from pydantic.fields import FieldInfo

from asyncppo.api import check
from asyncppo.config import ConfigError, RunConfig, dump_config, load_config
from asyncppo.config.schema_walk import iter_keys, suggest


def _describe_default(info: FieldInfo) -> str:
    if info.is_required():
        return "required"
    # A list or dict default comes from a factory; show the value a fresh config gets.
    default = info.get_default(call_default_factory=True)
    return f"default {default!r}"


def run_config_command(args: argparse.Namespace) -> int:
    """Print the resolved config, the pre-flight's verdict, or the documented list of keys."""
    if args.config_command == "port":
        from asyncppo.cli.config_port import run_config_port_command

        return run_config_port_command(args)
    if args.config_command == "show":
        print(dump_config(load_config(args.config, args.overrides)), end="")
        return 0
    if args.config_command == "check":
        checked = check(args.config, overrides=args.overrides, run_dir=args.run_dir)
        print(f"ok: {args.config}: {checked.summary()}", flush=True)
        return 0
    keys = list(iter_keys(RunConfig))
    matching = [(path, info) for path, info in keys if path.startswith(args.prefix)]
    if not matching:
        # An empty listing would read as "this section has no keys"; say the prefix names none, and the closest.
        hint = suggest("", args.prefix, [path for path, _ in keys])
        raise ConfigError([f"{args.prefix}: no config key starts with this prefix{hint}"])
    for path, info in matching:
        description = " ".join((info.description or "").split())
        print(f"{path} ({_describe_default(info)}): {description}")
    return 0
