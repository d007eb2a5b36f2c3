"""A generator stand-in for the weight-sync tests: a spawned process that runs commands sent over a pipe.

One process serves many steps of a test (spawning one costs ~2 s of torch import on 2 cores). Its "model" is a
small nn.Module built by `make_model`, loaded the way a generator's `load_weights` would (copy from the views).
"""

import os
import time
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import Any

import torch
import torch.multiprocessing as mp
from torch import nn

from asyncppo.distributed.buckets import ParamSpec, check_param_specs
from asyncppo.distributed.process_group import SyncGroupSpec, open_sync_group
from asyncppo.distributed.weight_sync import WeightReceiver, param_specs, weights_checksum


def make_model(seed: int, big_numel: int = 0, dtype: torch.dtype = torch.float32) -> nn.Module:
    """Two Linear layers in `dtype`, a bf16 layer norm and, if `big_numel`, one flat fp32 parameter that size."""
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(16, 32), nn.Tanh(), nn.Linear(32, 8)).to(dtype)
    model.append(nn.LayerNorm(8).to(torch.bfloat16))
    if big_numel:
        model.register_parameter("big", nn.Parameter(torch.randn(big_numel)))
    with torch.no_grad():
        model[3].weight.normal_()  # LayerNorm starts at exactly 1.0; random values make a lost copy visible
    return model


class _PeerState:
    def __init__(self) -> None:
        self.group = None
        self.model: nn.Module | None = None

    def close_group(self) -> None:
        if self.group is not None:
            self.group.close()
            self.group = None


def _open(state: _PeerState, spec: SyncGroupSpec, rank: int, device: str = "cpu") -> None:
    state.close_group()
    state.group = open_sync_group(spec, rank, torch.device(device))


def _build(
    state: _PeerState,
    seed: int,
    big_numel: int,
    dtype: torch.dtype,
    trainer_specs: list[ParamSpec],
    device: str = "cpu",
) -> None:
    state.model = make_model(seed, big_numel, dtype).to(device)
    check_param_specs(trainer_specs, param_specs(state.model.named_parameters()))


def _receive(
    state: _PeerState, specs: list[ParamSpec], bucket_size_bytes: int, version: int
) -> tuple[dict[str, torch.Tensor], str]:
    """Receive into the model; return its weights (CPU copies) and checksum (on its device), as a worker would."""
    assert state.group is not None and state.model is not None
    parameters = dict(state.model.named_parameters())
    with torch.no_grad():
        for name, view in WeightReceiver(state.group, specs, bucket_size_bytes).receive(version):
            parameters[name].copy_(view)
    weights = {name: tensor.detach().cpu().clone() for name, tensor in parameters.items()}
    return weights, weights_checksum(state.model.named_parameters())


def _receive_header_then_die(state: _PeerState, specs: list[ParamSpec], bucket_size_bytes: int, version: int) -> None:
    assert state.group is not None
    WeightReceiver(state.group, specs, bucket_size_bytes).receive(version)  # the header only: buckets come lazily
    os._exit(3)


_COMMANDS: dict[str, Callable[..., Any]] = {
    "open": _open,
    "build": _build,
    "receive": _receive,
    "receive_header_then_die": _receive_header_then_die,
    "close": lambda state: state.close_group(),
    "ping": lambda state: os.getpid(),
}


def serve(connection: Connection) -> None:
    """The peer process: run (id, command, kwargs) messages until "exit"; reply (id, "ok" | "error", result | text)."""
    state = _PeerState()
    while True:
        message_id, command, kwargs = connection.recv()
        if command == "exit":
            state.close_group()
            return
        try:
            connection.send((message_id, "ok", _COMMANDS[command](state, **kwargs)))
        except Exception as error:  # reported to the test, which asserts on it
            # A failed generator leaves the group, so the sender fails fast instead of waiting out its timeout.
            state.close_group()
            connection.send((message_id, "error", f"{type(error).__name__}: {error}"))


class PeerError(Exception):
    """A command failed inside the peer; the message is the peer's exception type and text."""


class Peer:
    """Test-side handle of one peer process: `send` a command, then `result` waits (bounded) for its reply."""

    def __init__(self) -> None:
        context = mp.get_context("spawn")
        self._connection, child_end = context.Pipe()
        self.process = context.Process(target=serve, args=(child_end,), daemon=True)
        self.process.start()
        self._last_id = 0

    def send(self, command: str, **kwargs: Any) -> None:
        self._last_id += 1
        self._connection.send((self._last_id, command, kwargs))

    def result(self, timeout_s: float = 30.0) -> Any:
        """The reply to the last command sent; replies a failed test left unread are skipped."""
        deadline = time.monotonic() + timeout_s
        while True:
            if not self._connection.poll(max(deadline - time.monotonic(), 0.0)):
                raise TimeoutError(f"peer {self.process.pid} gave no reply within {timeout_s} s")
            message_id, status, value = self._connection.recv()
            if message_id != self._last_id:
                continue
            if status == "error":
                raise PeerError(value)
            return value

    def call(self, command: str, **kwargs: Any) -> Any:
        self.send(command, **kwargs)
        return self.result()

    def stop(self) -> None:
        if self.process.is_alive():
            self._connection.send((0, "exit", {}))
            self.process.join(5)
        if self.process.is_alive():
            self.process.kill()
        self.process.join()
