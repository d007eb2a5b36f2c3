"""Layer 1: checkpoints. `manager` owns the step-directory protocol; `state` the driver's files inside a step."""

from asyncppo.checkpoint.manager import (
    TRAINING_INFO_FILE,
    CheckpointDamagedError,
    CheckpointError,
    CheckpointManager,
    CheckpointRecord,
    CrossCheck,
)
from asyncppo.checkpoint.state import (
    RUN_STATE_FILE,
    WARM_START_FILE,
    RunState,
    is_warm_start,
    load_run_state,
    load_state,
    mark_warm_start,
    restore_rng_state,
    save_rng_state,
    save_run_state,
    save_state,
    warm_start_source,
)

__all__ = [
    "RUN_STATE_FILE",
    "TRAINING_INFO_FILE",
    "WARM_START_FILE",
    "CheckpointDamagedError",
    "CheckpointError",
    "CheckpointManager",
    "CheckpointRecord",
    "CrossCheck",
    "RunState",
    "is_warm_start",
    "load_run_state",
    "load_state",
    "mark_warm_start",
    "restore_rng_state",
    "save_rng_state",
    "save_run_state",
    "save_state",
    "warm_start_source",
]
