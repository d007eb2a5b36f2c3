"""`asyncppo train CONFIG [key=value ...] [--run-dir DIR]`: prepare the run directory and train.

Until the sync PPO loop lands (issue #4) this validates the config, builds or finds the models and
writes the resolved config into the run directory, then says plainly that training is not there yet.
"""

import argparse
from pathlib import Path

from asyncppo.cli.builders import resolve_model_path
from asyncppo.config import dump_config, load_config


def run_train_command(args: argparse.Namespace) -> int:
    """Validate, prepare the run directory, and report what is ready."""
    config = load_config(args.config, args.overrides)
    run_dir = Path(args.run_dir or config.logger.log_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "config.yaml").write_text(dump_config(config))
    policy_path = resolve_model_path(config.model.model_name)
    print(f"config: valid, resolved config written to {run_dir / 'config.yaml'}")
    print(f"policy model: {policy_path}")
    if config.ppo.adv_estimator.uses_critic:
        print(f"value model: initialised from {resolve_model_path(config.value_model_name, 'value.model_name')}")
    print("training: not implemented yet; the sync PPO loop lands with issue #4. Nothing was trained.")
    return 0
