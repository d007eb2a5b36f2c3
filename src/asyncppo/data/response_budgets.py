"""Per-row response token budgets: a row's `data.max_new_tokens_key` field read as one budget per sample.

Single-turn rollouts (rollout/single_turn.py) cap each request's `max_new_tokens` with them; the trainer's
pre-flight reads every row's budgets once before anything starts, so a malformed field fails at once instead of
mid-run. Plain Python: the pre-flight runs before torch is imported.
"""

from collections.abc import Mapping
from typing import Any, cast


def row_token_budgets(row: Mapping[str, Any], where: str, key: str, num_generations: int) -> list[int]:
    """The response token budget of each of the row's `num_generations` samples, from its field `key`: one int
    for every sample or a list of `num_generations` ints, one per sample. ValueError naming `where` (the row),
    the key and the value when the field is missing or not positive ints of the right count."""
    if key not in row:
        raise ValueError(
            f"{where} has no response budget field {key!r} (data.max_new_tokens_key); its keys are {sorted(row)}"
        )
    value = row[key]
    budgets = cast(list[Any], value) if isinstance(value, list) else [value] * num_generations
    # bool is an int subclass; `true` as a budget is a data mistake, not 1 token.
    positive = all(isinstance(budget, int) and not isinstance(budget, bool) and budget >= 1 for budget in budgets)
    if not positive or len(budgets) != num_generations:
        raise ValueError(
            f"{where}: {key!r} (data.max_new_tokens_key) must be a positive int or a list of {num_generations} "
            f"positive ints (one per sample), got {value!r:.200}"
        )
    return budgets
