"""GeneratorWorker: a generation engine over a policy model, the generator role of the run.

Non-colocated, each generator host loads its own copy of the policy (`load_generator_worker`) and receives
pushed weights between batches; colocated, the policy worker builds one over its trained model (hf reads the
weights in place; graph copies them on `set_policy_version`). The driver reaches it through `workers/groups.py`.

    PolicyWorker (rank 0) --push_weights(version)--> sync group --receive_weights(version)--> GeneratorWorker

`open_sync` may be called again (the driver reconnects every generator after one was restarted): the new group
replaces the old one, whose transfer in progress, if any, fails and ends.
"""

import threading
from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch
from transformers import PreTrainedModel

from asyncppo.distributed.process_group import SyncGroupSpec, open_sync_group
from asyncppo.distributed.weight_sync import ParamSpec, WeightReceiver, check_param_specs, weights_checksum
from asyncppo.generation.engines import EngineSettings, build_engine, prefix_reuse_counters
from asyncppo.generation.protocol import GenerationRequest, GenerationResult
from asyncppo.models.policy import load_policy

if TYPE_CHECKING:  # the HTTP stack (fastapi, uvicorn) is imported only by runs that serve the gym
    from asyncppo.gym.policy_server_runner import PolicyServer
    from asyncppo.workers.policy_http import PolicyServerSettings


class GeneratorWorker:
    """A generation engine over `model`, its HTTP server for gym agents, and the weight-sync receiver."""

    def __init__(self, model: PreTrainedModel, engine: EngineSettings, rank: int):
        self.rank = rank
        self.model = model
        self.generator = build_engine(model, engine, rank)
        self._receiver: WeightReceiver | None = None
        self._specs: list[ParamSpec] = []
        # Serialises weight loads with each other; the engine's own lock keeps them out of running batches.
        self._sync_lock = threading.Lock()
        self._server: PolicyServer | None = None

    def serve_http(self, settings: "PolicyServerSettings", port: int | None = None) -> str:
        """Serve this engine to gym agents; returns the OpenAI base URL (`http://host:port/v1`). `port`: listen
        exactly there (a restarted generator takes the port its predecessor served, which the agents were given)."""
        if self._server is None:
            from asyncppo.workers.policy_http import start_policy_server

            self._server = start_policy_server(self.generator, settings, self.rank, port=port)
        return self._server.url

    def policy_requests_received(self) -> int:
        """HTTP requests this engine's policy server has received (0 when it serves none)."""
        return 0 if self._server is None else self._server.requests_received

    def generate(self, requests: Sequence[GenerationRequest]) -> list[GenerationResult]:
        return self.generator.generate(requests)

    def open_sync(self, spec: SyncGroupSpec, sync_rank: int, specs: list[ParamSpec], bucket_size_bytes: int) -> None:
        own = dict(self.model.named_parameters())
        missing = [spec.name for spec in specs if spec.name not in own]
        if missing:
            raise ValueError(f"generator rank {self.rank}: the trainer sends {missing[0]}, which this model lacks")
        check_param_specs(specs, [ParamSpec(spec.name, tuple(own[spec.name].shape), spec.dtype) for spec in specs])
        device = next(self.model.parameters()).device if spec.backend == "nccl" else torch.device("cpu")
        old = self._receiver
        if old is not None and spec.backend == "nccl":
            # A receive still waiting on the old group (its push broke off) would wait out the whole timeout on
            # NCCL; aborting the communicator ends it now. On gloo, the sender closing its end already ends it.
            old.abort()
        # Joined without the lock: a receive of the old group may hold it until the sender closes that group.
        group = open_sync_group(spec, rank=sync_rank, device=device)
        with self._sync_lock:
            if old is not None:
                old.close()
            self._specs = list(specs)
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
        """Restart the engine's sampling generator at `seed` offset by this rank."""
        self.generator.reseed(seed + 1000 * self.rank)

    def engine_counters(self) -> dict[str, float]:
        """This engine's cumulative prefix-reuse counters ({} for an engine without a prefix cache)."""
        return prefix_reuse_counters(self.generator)

    def close(self) -> None:
        """Stop the HTTP server, the engine and the weight-sync receiver's group."""
        if self._server is not None:
            self._server.stop()
        self.generator.close()
        if self._receiver is not None:
            self._receiver.close()


def load_generator_worker(
    model_path: str, dtype: torch.dtype, device: str, engine: EngineSettings, rank: int
) -> GeneratorWorker:
    """A GeneratorWorker on its own copy of the policy at `model_path` (built inside its host process)."""
    return GeneratorWorker(load_policy(model_path, dtype, device), engine, rank)
