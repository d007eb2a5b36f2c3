"""The key mapping table from a NeMo-RL PPO or GRPO config to asyncppo's, one rule per key pattern.

`outcome_for(key)` applies the first rule whose pattern (`fnmatch`, `*` spans dots) matches the dotted key; the
rules live with the sections they read (model_rules, generation_rules, algorithm_rules, data_rules, run_rules).
Keys no pattern names fall back to the same key in asyncppo's schema (NeMo-RL's `policy` read as `model`,
`grpo` as `ppo`, `async_grpo` as `async_ppo`, `env.nemo_gym` as `env.gym`): `ppo.*`, `loss_fn.*` and
`value_loss_fn.*` keep NeMo-RL's names. A key with no counterpart at all is refused.
"""

from fnmatch import fnmatchcase
from typing import Any

from asyncppo.config.nemo_rl.algorithm_rules import ALGORITHM_RULES
from asyncppo.config.nemo_rl.data_rules import DATA_RULES
from asyncppo.config.nemo_rl.generation_rules import GENERATION_RULES
from asyncppo.config.nemo_rl.model_rules import MODEL_RULES
from asyncppo.config.nemo_rl.rules import Outcome, Rule, Source, mapped, refuse
from asyncppo.config.nemo_rl.run_rules import RUN_RULES
from asyncppo.config.schema import RunConfig
from asyncppo.config.schema_walk import UnknownKeyError, find_field

RULES: list[tuple[str, Rule]] = [*MODEL_RULES, *GENERATION_RULES, *ALGORITHM_RULES, *DATA_RULES, *RUN_RULES]
_RENAMED_PREFIXES = (
    ("policy.generation.", "generation."),
    ("policy.", "model."),
    ("grpo.async_grpo.", "ppo.async_ppo."),
    ("grpo.", "ppo."),
    ("env.nemo_gym.", "env.gym."),
)


def schema_key(key: str) -> str:
    """The asyncppo key of the same meaning by name (`policy.` -> `model.`, `grpo.` -> `ppo.`, ...)."""
    for prefix, replacement in _RENAMED_PREFIXES:
        if key.startswith(prefix):
            return replacement + key.removeprefix(prefix)
    return key


def outcome_for(key: str, value: Any, source: Source) -> Outcome:
    """What the port does with `key` (dotted, NeMo-RL's) holding `value`."""
    for pattern, rule in RULES:
        if fnmatchcase(key, pattern):
            return rule(key, value, source)
    target = schema_key(key)
    try:
        field = find_field(RunConfig, target)
    except UnknownKeyError:
        return refuse("no asyncppo key of this name or meaning")(key, value, source)
    if field.section is not None and not field.free_form:
        return refuse("a section here, a value in asyncppo's schema")(key, value, source)
    return mapped(target, value)
