"""Porting NeMo-RL PPO and GRPO configs: loading (`defaults:`, `${...}`), the key mapping rules and the port itself."""

from asyncppo.config.nemo_rl.loader import load_nemo_rl_tree
from asyncppo.config.nemo_rl.port import (
    PortResult,
    PortRow,
    checked_tree,
    dump_tree,
    format_table,
    is_nemo_rl_tree,
    port_file,
    port_tree,
)

__all__ = [
    "PortResult",
    "PortRow",
    "checked_tree",
    "dump_tree",
    "format_table",
    "is_nemo_rl_tree",
    "load_nemo_rl_tree",
    "port_file",
    "port_tree",
]
