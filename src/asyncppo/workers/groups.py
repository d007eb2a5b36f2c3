"""The typed facade over the run's Ray worker groups, one class per role, and the weight sync between them.
This module (with the transport in `ray_host.py`) is the only place that names worker methods for remote calls;
the trainer, scripts and tests call the typed methods below.

    driver: ppo_step(PolicyGroup, ValueGroup) ; rollouts(GeneratorGroup) ; WeightSync.push(version)
                 |            |                          |                          |
           PolicyWorker   ValueWorker      GeneratorWorker ranks (or the      rank 0 -> ranks 1..N
                                           colocated PolicyWorker)

`PolicyModel` and `ValueModel` are what the PPO step needs of the policy and the critic: the groups here, the
in-process workers and the test fakes all provide them.
"""

from collections.abc import Iterable
from dataclasses import replace
from pathlib import Path
from typing import Any, Protocol

import torch

from asyncppo.config.runtime import WeightSyncConfig
from asyncppo.distributed.process_group import SyncGroupSpec, WeightSyncError
from asyncppo.distributed.weight_sync import PushReport, check_checksums
from asyncppo.types import TrainBatch
from asyncppo.workers.generator_worker import GeneratorWorker
from asyncppo.workers.policy_worker import PolicyWorker
from asyncppo.workers.ray_host import PendingCall, WorkerCallError, WorkerDiedError, WorkerGroup, gather_named
from asyncppo.workers.value_worker import Offsets, ValueWorker


class PolicyModel(Protocol):
    """The policy side of a PPO step."""

    def logprobs(self, batch: TrainBatch) -> torch.Tensor: ...

    def reference_logprobs(self, batch: TrainBatch) -> torch.Tensor: ...

    def train(self, batch: TrainBatch) -> dict[str, float]: ...

    def train_on_policy(self, batch: TrainBatch) -> tuple[dict[str, float], torch.Tensor]: ...


class ValueModel(Protocol):
    """The critic side of a PPO step: `train` takes an optimizer pass, `evaluate` only re-scores."""

    def values(self, batch: TrainBatch) -> torch.Tensor: ...

    def train(self, batch: TrainBatch, offsets: Offsets | None = None) -> dict[str, float]: ...

    def evaluate(self, batch: TrainBatch, offsets: Offsets | None = None) -> dict[str, float]: ...


class PolicyGroup:
    """The policy workers: every rank takes part in each call (the data-parallel ranks run collectives together);
    rank 0 answers."""

    def __init__(self, group: WorkerGroup[PolicyWorker]):
        self.group = group

    def logprobs(self, batch: TrainBatch) -> torch.Tensor:
        return self.group.call_all(PolicyWorker.logprobs, batch)[0]

    def reference_logprobs(self, batch: TrainBatch) -> torch.Tensor:
        return self.group.call_all(PolicyWorker.reference_logprobs, batch)[0]

    def train(self, batch: TrainBatch) -> dict[str, float]:
        return self.group.call_all(PolicyWorker.train, batch)[0]

    def train_on_policy(self, batch: TrainBatch) -> tuple[dict[str, float], torch.Tensor]:
        return self.group.call_all(PolicyWorker.train_on_policy, batch)[0]

    def save(self, directory: Path) -> None:
        """Write the policy checkpoint into `directory` (every rank gathers its shards; rank 0 writes)."""
        self.group.call_all(PolicyWorker.save, directory)

    def load(self, directory: Path) -> None:
        """Every rank loads weights, optimizer and scheduler from a `save` directory (resume)."""
        self.group.call_all(PolicyWorker.load, directory)

    def weights(self) -> dict[str, torch.Tensor]:
        """CPU copies of the weights as pushed (for inspection and tests; gathered from every rank's shards)."""
        return self.group.call_all(PolicyWorker.weights)[0]

    def __len__(self) -> int:
        """Data-parallel ranks."""
        return len(self.group)


class ValueGroup:
    """The value (critic) workers."""

    def __init__(self, group: WorkerGroup[ValueWorker]):
        self.group = group

    def values(self, batch: TrainBatch) -> torch.Tensor:
        return self.group.call_all(ValueWorker.values, batch)[0]

    def train(self, batch: TrainBatch, offsets: Offsets | None = None) -> dict[str, float]:
        return self.group.call_all(ValueWorker.train, batch, offsets)[0]

    def evaluate(self, batch: TrainBatch, offsets: Offsets | None = None) -> dict[str, float]:
        return self.group.call_all(ValueWorker.evaluate, batch, offsets)[0]

    def save(self, directory: Path) -> None:
        """Write the critic checkpoint into `directory` (every rank gathers its shards; rank 0 writes)."""
        self.group.call_all(ValueWorker.save, directory)

    def load(self, directory: Path) -> None:
        """Every rank loads weights, optimizer and scheduler from a `save` directory (resume)."""
        self.group.call_all(ValueWorker.load, directory)

    def warm_start(self, directory: str) -> None:
        """Every rank loads critic weights from `directory` with a fresh optimizer and schedule."""
        self.group.call_all(ValueWorker.warm_start, directory)


class WeightSync:
    """Pushes the policy from policy rank 0 to every generator rank and verifies the copies. The other policy ranks
    take part in every push: they gather their shards of each tensor with rank 0. After a generator is restarted (or
    a push broke off part-way), `reconnect` opens a fresh sync group with every rank as it is now."""

    def __init__(
        self,
        policy: WorkerGroup[PolicyWorker],
        generators: WorkerGroup[GeneratorWorker],
        spec: SyncGroupSpec,
        settings: WeightSyncConfig,
    ):
        self.policy = policy
        self.generators = generators
        self.settings = settings
        self.spec = spec
        self.num_pushes = 0
        self.specs = policy.call_all(PolicyWorker.param_specs)[0]
        self._open()

    def reconnect(self) -> None:
        """Open a fresh sync group (a new port on policy rank 0's node) with every rank as it is now; each member
        closes its old group as it joins, which also ends a transfer its old group still waited on."""
        host, port = self.policy.rendezvous_address(0)
        self.spec = replace(self.spec, host=host, port=port)
        self._open()

    def _open(self) -> None:
        spec, bucket_bytes = self.spec, self.settings.bucket_size_bytes
        # Every participant must join at once: waiting on rank 0 alone would deadlock the rendezvous.
        calls: list[tuple[WorkerGroup[Any], PendingCall[Any]]] = [
            (self.policy, self.policy.submit(0, PolicyWorker.open_sync, spec, self.specs, bucket_bytes))
        ]
        calls += [
            (
                self.generators,
                self.generators.submit(rank, GeneratorWorker.open_sync, spec, rank + 1, self.specs, bucket_bytes),
            )
            for rank in range(len(self.generators))
        ]
        self._gather(calls, "open_sync", spec.timeout_s + 30)

    def push(self, version: int, check: bool | None = None) -> PushReport:
        """Broadcast the current policy as `version`; compare checksums every checksum_period pushes (`check`: always
        or never)."""
        self.num_pushes += 1
        period = self.settings.checksum_period
        if check is None:
            check = period > 0 and self.num_pushes % period == 0
        calls: list[tuple[WorkerGroup[Any], PendingCall[Any]]] = [
            (self.policy, call) for call in self.policy.submit_all(PolicyWorker.push_weights, version, check)
        ]
        calls += [
            (self.generators, self.generators.submit(rank, GeneratorWorker.receive_weights, version, check))
            for rank in range(len(self.generators))
        ]
        results = self._gather(calls, "push", self.settings.timeout_s + 30)
        report, checksums = results[0], results[len(self.policy) :]
        assert isinstance(report, PushReport)
        if check:
            assert report.checksum is not None
            received = {rank + 1: str(value) for rank, value in enumerate(checksums)}
            check_checksums(report.checksum, received, version)
        return report

    def _gather(
        self, calls: Iterable[tuple[WorkerGroup[Any], PendingCall[Any]]], what: str, timeout_s: float
    ) -> list[Any]:
        """The calls' results; the first failure at once: a WorkerDiedError as it is (the caller may restart a
        generator), anything else as a WeightSyncError naming the call."""
        try:
            return gather_named(list(calls), timeout_s)
        except WorkerDiedError:
            raise
        except WorkerCallError as error:
            raise WeightSyncError(f"weight sync {what} failed: {error}") from error
