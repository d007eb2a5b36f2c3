"""Layer 0: the run config: one pydantic v2 tree, YAML files with dotted overrides, and its load-time rules."""

from asyncppo.config.loading import ConfigError, dump_config, load_config, load_yaml_tree, validate_tree
from asyncppo.config.schema import RunConfig

__all__ = ["ConfigError", "RunConfig", "dump_config", "load_config", "load_yaml_tree", "validate_tree"]
