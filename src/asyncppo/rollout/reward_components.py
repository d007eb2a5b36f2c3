"""`reward/<component>` metrics: the mean of each named reward part (gym `reward_components`) over a step's rollouts.

Called by the driver loop on each step's trajectories and by validation (with the `val/` namespace).
"""

import re
from collections.abc import Sequence

from asyncppo.types import Trajectory

# Characters a metric name keeps; anything else (spaces, slashes, colons) becomes '_', so a component name can
# neither nest a namespace nor upset a sink (TensorBoard, MLflow refuse some characters).
_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]")


def metric_safe_name(name: str) -> str:
    """`name` with every character outside letters, digits, `_`, `.`, `-` replaced by `_` (empty -> `_`)."""
    return _UNSAFE.sub("_", name) or "_"


def reward_component_metrics(trajectories: Sequence[Trajectory], namespace: str = "") -> dict[str, float]:
    """{`<namespace>reward/<name>`: mean of that component} over the trajectories that report it.

    A component missing from some rollouts (a batch mixing environments) is averaged over those that have it, so
    each mean stays on its component's own scale. Names are sanitised (`metric_safe_name`); two names that
    sanitise alike are pooled. {} when no trajectory has components (single-turn reward functions).
    """
    sums: dict[str, float] = {}
    counts: dict[str, int] = {}
    for trajectory in trajectories:
        for name, value in trajectory.reward_components.items():
            key = f"{namespace}reward/{metric_safe_name(name)}"
            sums[key] = sums.get(key, 0.0) + value
            counts[key] = counts.get(key, 0) + 1
    return {key: sums[key] / counts[key] for key in sorted(sums)}
