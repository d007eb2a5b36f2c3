"""`asyncppo critic collect|pretrain CONFIG [key=value ...] [--run-dir DIR]`: offline critic pretraining.

    collect   rollouts of the config's policy -> RUN_DIR/critic_data/shard_NNNNN.jsonl (resumable)
    pretrain  the value model alone on those shards -> RUN_DIR/critic_pretrain/{metrics.jsonl, value/}

Then `asyncppo train CONFIG value.warm_start_path=RUN_DIR/critic_pretrain/value` starts PPO from that critic.
The work lives in `trainer/critic_collection.py` and `trainer/critic_pretraining.py`; this is the command.
"""

import argparse
from pathlib import Path

from asyncppo.config import ConfigError, load_config


def add_critic_arguments(commands: "argparse._SubParsersAction[argparse.ArgumentParser]") -> None:
    """The `critic` command and its two subcommands."""
    critic = commands.add_parser("critic", help="offline critic pretraining: collect rollout shards, train the critic")
    subcommands = critic.add_subparsers(dest="critic_command", required=True, metavar="SUBCOMMAND")
    collect = subcommands.add_parser(
        "collect", help="generate rollouts with the config's policy into RUN_DIR/critic_data (resumable)"
    )
    pretrain = subcommands.add_parser(
        "pretrain", help="train the value model alone on the shards; writes RUN_DIR/critic_pretrain/value"
    )
    for parser in (collect, pretrain):
        parser.add_argument("config", help="YAML run config (the one `asyncppo train` takes)")
        parser.add_argument("overrides", nargs="*", metavar="key=value", help="dotted overrides")
        parser.add_argument("--run-dir", default=None, help="run directory (default: logger.log_dir)")
    collect.add_argument(
        "--shards", type=int, default=None, help="stop once this many shards are complete (critic_pretrain.num_shards)"
    )


def run_critic_command(args: argparse.Namespace) -> int:
    from asyncppo.trainer.setup import resolve_setup

    config = load_config(args.config, args.overrides)
    run_dir = Path(args.run_dir or config.logger.log_dir)
    collect = args.critic_command == "collect"
    if collect and args.shards is not None and args.shards < 1:
        raise ConfigError([f"--shards: {args.shards} is not a shard count; expected an integer >= 1"])
    # Collection draws prompts from the data (pre-flight checked); pretraining reads only the collected shards.
    setup = resolve_setup(config, Path(args.config).resolve().parent, data=collect)
    if collect:
        from asyncppo.trainer.critic_collection import collect_shards

        paths = collect_shards(setup, run_dir, num_shards=args.shards)
        print(f"{len(paths)} shards in {run_dir}", flush=True)
        return 0
    from asyncppo.trainer.critic_pretraining import pretrain_critic

    checkpoint, _ = pretrain_critic(setup, run_dir)
    print(f"critic checkpoint: {checkpoint}; warm-start PPO with value.warm_start_path={checkpoint}", flush=True)
    return 0
