"""What a run saves after a step and restores on start: `step_N/` of the checkpoint directory.

    step_N/  policy/ (once it has trained), value/     weights, optimizer, scheduler (the worker groups write them)
             batch_source.pt                           data position; async: buffer and collector
             accounting.json                           where every prompt drawn is (trained, dropped, buffered, ...)
             rng.pt, training_info.json (run state), config.yaml

`checkpoint/manager.py` makes each write atomic (a directory without training_info.json is not a checkpoint) and
keeps the best `keep_top_k`. Built by `trainer/build.py`; the loop calls `restore` once and `save` on schedule.
"""

import dataclasses
import json
import logging
import math
from dataclasses import dataclass
from pathlib import Path

from asyncppo.checkpoint import (
    CheckpointManager,
    RunState,
    load_run_state,
    load_state,
    restore_rng_state,
    save_rng_state,
    save_run_state,
    save_state,
)
from asyncppo.config import RunConfig, dump_config
from asyncppo.pipeline.sources import BatchSource
from asyncppo.workers.groups import PolicyGroup, ValueGroup

log = logging.getLogger(__name__)
POLICY_DIR, VALUE_DIR, SOURCE_STATE_FILE, RNG_STATE_FILE, CONFIG_FILE, ACCOUNTING_FILE = (
    "policy",
    "value",
    "batch_source.pt",
    "rng.pt",
    "config.yaml",
    "accounting.json",
)


def checkpoint_manager(config: RunConfig, run_dir: Path) -> CheckpointManager | None:
    """The run's checkpoint directory (checkpointing.checkpoint_dir, default RUN_DIR/checkpoints); None when
    checkpointing is off."""
    section = config.checkpointing
    if not section.enabled:
        return None
    directory = Path(section.checkpoint_dir or run_dir / "checkpoints")
    return CheckpointManager(directory, section.keep_top_k, section.metric_name, section.higher_is_better)


def resume_step(manager: CheckpointManager | None) -> int:
    """The step the newest complete checkpoint holds; 0 without one."""
    latest = manager.latest() if manager is not None else None
    return load_run_state(latest).step if latest is not None else 0


@dataclass
class RunCheckpoints:
    """Saves and restores the state a run needs to continue exactly where it was."""

    manager: CheckpointManager | None
    """None when checkpointing is off: nothing is saved, and a run starts fresh."""
    config: RunConfig
    policy: PolicyGroup
    value: ValueGroup | None
    source: BatchSource

    def latest(self) -> Path | None:
        return self.manager.latest() if self.manager is not None else None

    def restore(self) -> int:
        """Resume from the newest complete checkpoint; returns the step to start from (0 for a fresh run, whose
        critic is warm-started from value.warm_start_path when set)."""
        latest = self.latest()
        if latest is None:
            self._warm_start_critic()
            return 0
        state = load_run_state(latest)
        assert self.manager is not None  # latest() found a checkpoint
        for step, reason in sorted(self.manager.rejected.items(), reverse=True):
            if step > state.step:
                print(f"note: step_{step} failed verification ({reason}); resuming from {latest.name}", flush=True)
        if (latest / POLICY_DIR).is_dir():
            self.policy.load(latest / POLICY_DIR)
        else:
            log.warning(
                "checkpoint %s has no policy (still in critic warm-up): the policy starts from its base", latest
            )
        if self.value is not None:
            self.value.load(latest / VALUE_DIR)
        self.source.load_state_dict(load_state(latest / SOURCE_STATE_FILE))
        restore_rng_state(load_state(latest / RNG_STATE_FILE))
        print(f"resumed from {latest} (step {state.step})", flush=True)
        return state.step

    def _warm_start_path(self) -> str | None:
        return self.config.value.warm_start_path if self.config.value is not None else None

    def _warm_start_critic(self) -> None:
        path = self._warm_start_path()
        if path is not None and self.value is not None:
            self.value.warm_start(path)
            print(f"critic warm-started from {path} (weights only, fresh optimizer)", flush=True)

    def save(self, step: int, metrics: dict[str, float], policy_has_trained: bool) -> Path | None:
        """Write checkpoint `step_<step>` (the state after `step` completed steps); None when checkpointing is off."""
        if self.manager is None:
            return None
        directory = self.manager.begin(step)
        if policy_has_trained:
            self.policy.save(directory / POLICY_DIR)
        if self.value is not None:
            self.value.save(directory / VALUE_DIR)
        # One snapshot: the books then describe exactly the state a resume starts from (the async collector runs on).
        snapshot = self.source.snapshot()
        source_state = snapshot.state
        save_state(directory / SOURCE_STATE_FILE, source_state)
        # The run's own books: every prompt drawn is trained, dropped with a reason, buffered or pending.
        (directory / ACCOUNTING_FILE).write_text(json.dumps(dataclasses.asdict(snapshot.accounting), indent=1))
        save_state(directory / RNG_STATE_FILE, save_rng_state())
        # Where the critic's first weights came from stays on record in every checkpoint of the run.
        warm_start = self._warm_start_path()
        prompts = source_state.get("prompts", {})
        run_state = RunState(
            step=step,
            epoch=int(prompts.get("epoch", 0)),
            num_consumed_prompts=int(prompts.get("num_prompts_consumed", step * self.config.ppo.num_prompts_per_step)),
            extra={"value_warm_start": warm_start} if warm_start else {},
        )
        save_run_state(directory, run_state)
        (directory / CONFIG_FILE).write_text(dump_config(self.config))
        ranking = {key.replace("/", ":", 1): value for key, value in metrics.items() if math.isfinite(value)}
        return self.manager.finalize(step, {**metrics, **ranking})
