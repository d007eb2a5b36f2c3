"""What each Ray host runs: the policy endpoint (trainer, weight-sync sender, colocated generator) and the
generator endpoint (a generation engine on its own copy of the weights, weight-sync receiver).

Plain classes, built inside the host process by a factory (`functools.partial(Endpoint, ...)`), so they are
also usable in-process. The driver reaches them through `workers/remote.py`.

    PolicyEndpoint (rank 0)  --push(version)--> sync group --receive(version)--> GeneratorEndpoint (ranks 1..N)
      colocated: the engine over policy.model (hf reads it in place; graph copies it on set_policy_version)
"""

import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING

import torch

from asyncppo.distributed.process_group import SyncGroupSpec, open_sync_group
from asyncppo.distributed.weight_sync import (
    ParamSpec,
    PushReport,
    WeightReceiver,
    WeightSender,
    check_param_specs,
    param_specs,
    weights_checksum,
)
from asyncppo.generation.engines import EngineSettings, build_engine, prefix_reuse_counters
from asyncppo.generation.protocol import GenerationRequest, GenerationResult
from asyncppo.models.policy import load_policy
from asyncppo.types import TrainBatch
from asyncppo.workers.policy_worker import PolicyWorker
from asyncppo.workers.value_worker import ValueWorker

if TYPE_CHECKING:  # the HTTP stack (fastapi, uvicorn) is imported only by runs that serve the gym
    from asyncppo.gym.policy_server import PolicyServer
    from asyncppo.workers.policy_http import PolicyServerSettings


class PolicyEndpoint:
    """The policy trainer of one rank, plus (rank 0) the weight-sync sender and (colocated) the generator."""

    def __init__(self, worker: PolicyWorker, colocated_engine: EngineSettings | None, rank: int = 0):
        self.worker = worker
        self.rank = rank
        self.generator = build_engine(worker.model, colocated_engine, rank) if colocated_engine is not None else None
        self._sender: WeightSender | None = None
        self._server: PolicyServer | None = None
        self._memory = PhasePeaks(next(worker.model.parameters()).device)

    # -- training (the PolicyModel side of the PPO step) --
    def logprobs(self, batch: TrainBatch) -> torch.Tensor:
        return self.worker.logprobs(batch)

    def reference_logprobs(self, batch: TrainBatch) -> torch.Tensor:
        return self.worker.reference_logprobs(batch)

    def train(self, batch: TrainBatch) -> dict[str, float]:
        with self._memory.phase("train"):
            metrics = self.worker.train(batch)
        if self.generator is not None:  # colocated: the engine's KV cache and the training state share the GPU
            metrics.update(self._memory.report())
        return metrics

    def save(self, directory: str) -> str:
        return str(self.worker.save(directory))

    def load(self, directory: str, load_optimizer: bool = True) -> None:
        self.worker.load(directory, load_optimizer=load_optimizer)

    # -- colocated generation --
    def generate(self, requests: Sequence[GenerationRequest]) -> list[GenerationResult]:
        if self.generator is None:
            raise RuntimeError("this policy worker has no colocated generator (generation.colocated.enabled=false)")
        with self._memory.phase("generation"):
            return self.generator.generate(requests)

    def set_policy_version(self, version: int) -> None:
        if self.generator is not None:
            self.generator.set_policy_version(version)

    def reseed(self, seed: int) -> None:
        if self.generator is not None:
            self.generator.reseed(seed + 1000 * self.rank)

    def engine_counters(self) -> dict[str, float]:
        """The colocated engine's cumulative prefix-reuse counters ({} for hf or without a generator)."""
        return prefix_reuse_counters(self.generator)

    def serve_http(self, settings: "PolicyServerSettings") -> str:
        """Serve the colocated generator to gym agents; returns the OpenAI base URL (`http://host:port/v1`)."""
        if self.generator is None:
            raise RuntimeError("this policy worker has no colocated generator to serve")
        if self._server is None:
            from asyncppo.workers.policy_http import start_policy_server

            self._server = start_policy_server(self.generator, settings, self.rank)
        return self._server.url

    # -- weight sync, sender side --
    def param_specs(self) -> list[ParamSpec]:
        return param_specs(self.worker.named_weights())

    def open_sync(self, spec: SyncGroupSpec, bucket_size_bytes: int) -> None:
        group = open_sync_group(spec, rank=0, device=self._sync_device(spec))
        self._sender = WeightSender(group, self.param_specs(), bucket_size_bytes)

    def push_weights(self, version: int, compute_checksum: bool) -> PushReport:
        if self._sender is None:
            raise RuntimeError("push_weights before open_sync")
        return self._sender.push(self.worker.named_weights(), version, compute_checksum=compute_checksum)

    def weights_checksum(self) -> str:
        """Checksum of the weights as pushed (names and dtypes of `param_specs`)."""
        return weights_checksum(self.worker.named_weights())

    def weights(self) -> dict[str, torch.Tensor]:
        """CPU copies of the weights as pushed (for inspection and tests; not a hot path)."""
        return {name: tensor.detach().cpu().clone() for name, tensor in self.worker.named_weights()}

    def _sync_device(self, spec: SyncGroupSpec) -> torch.device:
        return next(self.worker.model.parameters()).device if spec.backend == "nccl" else torch.device("cpu")

    def close(self) -> None:
        if self._server is not None:
            self._server.stop()
        if self.generator is not None:
            self.generator.close()


class PhasePeaks:
    """Peak device memory of named phases of a colocated policy process (CUDA only; nothing on CPU).

    A phase may be entered by several threads at once (rollout threads each call `generate`): the peak counter
    is reset when the first enters and read when the last leaves. Phases of one process do not overlap in time
    (colocated runs are synchronous: generation, then logprobs, then training).
    """

    def __init__(self, device: torch.device):
        self.device = device
        self._lock = threading.Lock()
        self._inside: dict[str, int] = {}
        self._peaks: dict[str, int] = {}

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        if self.device.type != "cuda":
            yield
            return
        with self._lock:
            self._inside[name] = self._inside.get(name, 0) + 1
            if self._inside[name] == 1:
                torch.cuda.reset_peak_memory_stats(self.device)
        try:
            yield
        finally:
            with self._lock:
                self._inside[name] -= 1
                if self._inside[name] == 0:
                    self._peaks[name] = torch.cuda.max_memory_allocated(self.device)

    def report(self) -> dict[str, float]:
        """`memory/{phase}_peak_gib` of each phase's latest run."""
        with self._lock:
            return {f"memory/{name}_peak_gib": peak / 2**30 for name, peak in self._peaks.items()}


class ValueEndpoint:
    """The value trainer of one rank (the ValueModel side of the PPO step)."""

    def __init__(self, worker: ValueWorker):
        self.worker = worker

    def values(self, batch: TrainBatch) -> torch.Tensor:
        return self.worker.values(batch)

    def train(
        self,
        batch: TrainBatch,
        offsets: tuple[torch.Tensor, torch.Tensor] | None = None,
        eval_only: bool = False,
    ) -> dict[str, float]:
        return self.worker.train(batch, offsets=offsets, eval_only=eval_only)

    def save(self, directory: str) -> str:
        return str(self.worker.save(directory))

    def load(self, directory: str, load_optimizer: bool = True) -> None:
        self.worker.load(directory, load_optimizer=load_optimizer)

    def warm_start(self, directory: str) -> None:
        self.worker.warm_start(directory)


class GeneratorEndpoint:
    """A generation engine on its own copy of the policy, loading pushed weights between batches."""

    def __init__(self, model_path: str, dtype: torch.dtype, device: str, engine: EngineSettings, rank: int):
        self.rank = rank
        self.model = load_policy(model_path, dtype, device)
        self.generator = build_engine(self.model, engine, rank)
        self._receiver: WeightReceiver | None = None
        self._specs: list[ParamSpec] = []
        # Serialises weight loads with each other; the engine's own lock keeps them out of running batches.
        self._sync_lock = threading.Lock()
        self._server: PolicyServer | None = None

    def serve_http(self, settings: "PolicyServerSettings") -> str:
        """Serve this engine to gym agents; returns the OpenAI base URL (`http://host:port/v1`)."""
        if self._server is None:
            from asyncppo.workers.policy_http import start_policy_server

            self._server = start_policy_server(self.generator, settings, self.rank)
        return self._server.url

    def generate(self, requests: Sequence[GenerationRequest]) -> list[GenerationResult]:
        return self.generator.generate(requests)

    def open_sync(self, spec: SyncGroupSpec, sync_rank: int, specs: list[ParamSpec], bucket_size_bytes: int) -> None:
        own = dict(self.model.named_parameters())
        missing = [spec.name for spec in specs if spec.name not in own]
        if missing:
            raise ValueError(f"generator rank {self.rank}: the trainer sends {missing[0]}, which this model lacks")
        check_param_specs(specs, [ParamSpec(spec.name, tuple(own[spec.name].shape), spec.dtype) for spec in specs])
        self._specs = list(specs)
        device = next(self.model.parameters()).device if spec.backend == "nccl" else torch.device("cpu")
        group = open_sync_group(spec, rank=sync_rank, device=device)
        self._receiver = WeightReceiver(group, specs, bucket_size_bytes)

    def receive_weights(self, version: int, compute_checksum: bool) -> str | None:
        """Receive a push, load it into the engine (paused meanwhile) and return the new weights' checksum."""
        if self._receiver is None:
            raise RuntimeError("receive_weights before open_sync")
        with self._sync_lock:
            self.generator.pause()
            try:
                received = [(name, tensor.clone()) for name, tensor in self._receiver.receive(version)]
                self.generator.load_weights(received, version)
            finally:
                self.generator.resume()
        return self.weights_checksum() if compute_checksum else None

    def weights_checksum(self) -> str:
        """Checksum of the weights as the trainer sends them (by its specs: names and wire dtypes)."""
        named = dict(self.model.named_parameters())
        if not self._specs:
            return weights_checksum(named.items())
        return weights_checksum((spec.name, named[spec.name].to(spec.dtype)) for spec in self._specs)

    def policy_version(self) -> int:
        return self.generator.policy_version

    def weights(self) -> dict[str, torch.Tensor]:
        """CPU copies of the engine's weights, by the names the trainer sends (for inspection and tests)."""
        named = dict(self.model.named_parameters())
        names = [spec.name for spec in self._specs] or list(named)
        return {name: named[name].detach().cpu().clone() for name in names}

    def set_policy_version(self, version: int) -> None:
        self.generator.set_policy_version(version)

    def reseed(self, seed: int) -> None:
        self.generator.reseed(seed + 1000 * self.rank)

    def engine_counters(self) -> dict[str, float]:
        """This engine's cumulative prefix-reuse counters ({} for hf)."""
        return prefix_reuse_counters(self.generator)

    def close(self) -> None:
        if self._server is not None:
            self._server.stop()
        self.generator.close()
