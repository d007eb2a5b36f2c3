"""A non-colocated run listens on loopback only: Ray's daemons and workers, the weight-sync store, every socket of
the test process and its descendants, read from /proc while the run is up (after its first step)."""

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from asyncppo.config import validate_tree
from asyncppo.distributed.process_group import free_port
from asyncppo.trainer import build
from asyncppo.trainer.build import build_run
from asyncppo.trainer.loop import train
from listening_sockets import Listener, listeners, process_tree

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def test_a_non_colocated_run_listens_on_loopback_only(
    ray_cluster: None,
    cache_dir: Path,
    data_dir: Path,
    tmp_path: Path,
    tiny_run_tree: Callable[..., dict[str, Any]],
    monkeypatch: pytest.MonkeyPatch,
):
    tree = tiny_run_tree(data_dir)
    tree["generation"]["colocated"] = {"enabled": False}
    tree["ppo"]["val_at_end"] = False
    tree["checkpointing"]["enabled"] = False
    monkeypatch.setenv("ASYNCPPO_CACHE_DIR", str(cache_dir))
    sync_ports: list[int] = []

    def recorded_free_port() -> int:
        sync_ports.append(free_port())
        return sync_ports[-1]

    monkeypatch.setattr(build, "free_port", recorded_free_port)  # to find the weight-sync store among the sockets
    run = build_run(validate_tree(tree), tmp_path)
    seen: list[list[Listener]] = []
    log_metrics = run.metrics.log

    def log_and_look(step: int, metrics: dict[str, float]) -> None:
        # Called by the loop after each step's weight push: every worker and the sync group are up.
        seen.append(listeners(process_tree(os.getpid())))
        log_metrics(step, metrics)

    monkeypatch.setattr(run.metrics, "log", log_and_look)
    try:
        assert run.weight_sync is not None, "a non-colocated run syncs weights through the sync group"
        train(run)
    finally:
        run.close()
    assert len(seen) == 2
    for step_listeners in seen:
        assert [listener.port for listener in step_listeners if listener.port in sync_ports] == sync_ports
        exposed = [listener for listener in step_listeners if not listener.is_loopback]
        assert exposed == [], f"listening beyond loopback: {exposed}"
