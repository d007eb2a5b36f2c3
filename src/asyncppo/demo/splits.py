"""Deterministic disjoint train/validation splits of the generated demo tasks (arithmetic, multi-step tools)."""

import random
from typing import TypeVar

T = TypeVar("T")


def disjoint_splits(
    problems: list[T], num_validation: int, seed: int, num_train: int | None, description: str
) -> tuple[list[T], list[T]]:
    """(train, validation): disjoint problems drawn without replacement; the same arguments give the same lists.

    Validation is drawn first, so num_train never changes it; num_train=None takes every other problem.
    `description` names the problem set in the error for sizes that do not fit. `problems` is shuffled in place.
    """
    num_train = len(problems) - num_validation if num_train is None else num_train
    if num_train < 1 or num_validation < 0 or num_train + num_validation > len(problems):
        raise ValueError(
            f"num_train={num_train} (>= 1) plus num_validation={num_validation} (>= 0) must fit in the "
            f"{len(problems)} problems{description}"
        )
    random.Random(seed).shuffle(problems)
    return problems[num_validation : num_validation + num_train], problems[:num_validation]
