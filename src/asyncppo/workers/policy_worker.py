"""PolicyWorker: the trained policy (and its frozen reference), the policy role of the run, one per rank.

Called through `workers/groups.py` by the driver's PPO step (old and reference logprobs, then `train` once per
ppo_epoch), by weight sync (rank 0 sends: `open_sync`, `push_weights`) and by the checkpointer (`save`,
`load`); usable in-process as well (tests). Colocated, it also holds the run's GeneratorWorker over its own
model, so generation calls land here. Letters: B samples, S positions.
"""

import copy
import functools
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from asyncppo.algorithms.microbatch import LossNormalizers, loss_normalizers
from asyncppo.algorithms.policy_loss import policy_loss
from asyncppo.config.losses import PolicyLossConfig
from asyncppo.distributed.process_group import SyncGroupSpec, open_sync_group
from asyncppo.distributed.weight_sync import ParamSpec, PushReport, WeightSender, param_specs, weights_checksum
from asyncppo.generation.engines import EngineSettings
from asyncppo.generation.protocol import GenerationRequest, GenerationResult
from asyncppo.models.policy import load_policy, token_logprobs
from asyncppo.types import TrainBatch
from asyncppo.workers.data_parallel import sum_tensor_over_ranks
from asyncppo.workers.generator_worker import GeneratorWorker
from asyncppo.workers.phase_peaks import PhasePeaks
from asyncppo.workers.scoring import ScoringModel, resolve_dtype
from asyncppo.workers.trained_model import TrainedModelSettings, TrainedWorker, scoring_model
from asyncppo.workers.training import MicroBatch

if TYPE_CHECKING:  # the HTTP stack (fastapi, uvicorn) is imported only by runs that serve the gym
    from asyncppo.workers.policy_http import PolicyServerSettings


@dataclass(frozen=True, kw_only=True)
class PolicyWorkerSettings(TrainedModelSettings):
    """The policy's own settings on top of the trained-model ones."""

    temperature: float
    """Sampling temperature: logprobs are scored under it exactly as the generator samples."""
    logprob_chunk_size: int
    loss_settings: PolicyLossConfig
    keep_reference: bool
    """Keep a frozen copy of the initial weights for reference logprobs (a reference KL term)."""


def _policy_normalizers(batch: TrainBatch) -> LossNormalizers:
    return loss_normalizers(batch.token_mask, batch.sample_mask, batch.rewards)


class PolicyWorker(TrainedWorker):
    """The policy under PPO, its optimizer, (with `keep_reference`) a frozen copy of its initial weights, the
    weight-sync sender (rank 0) and, colocated, the generation engine over the trained model."""

    def __init__(
        self,
        model_path: str | Path,
        device: str | torch.device,
        settings: PolicyWorkerSettings,
        colocated_engine: EngineSettings | None = None,
        rank: int = 0,
    ) -> None:
        """Load the policy from `model_path` (a local causal LM directory) onto `device` in `settings.dtype`.

        The reference policy is the weights of `model_path`; a later `load` (resume) changes only the trained
        policy, so the reference stays the initial policy.
        """
        if settings.temperature <= 0:
            raise ValueError(f"temperature must be > 0, got {settings.temperature}")
        dtype, device = resolve_dtype(settings.dtype), torch.device(device)
        self._loss_settings = settings.loss_settings
        policy = load_policy(model_path, dtype, device)
        # The reference is only ever scored without grad; its parameters keep requires_grad as the policy's so that
        # its compiled layers reuse the policy's no-grad graph (a parameter's requires_grad is part of a graph's
        # guards: a frozen copy compiled a third graph at start-up). No optimizer ever holds them.
        reference = copy.deepcopy(policy) if settings.keep_reference else None
        forward = functools.partial(
            token_logprobs, temperature=settings.temperature, chunk_size=settings.logprob_chunk_size
        )

        def read_weights(directory: Path) -> dict[str, torch.Tensor]:
            return load_policy(directory, dtype, "cpu").state_dict()

        super().__init__(policy, forward, read_weights, model_path=model_path, device=device, settings=settings)
        self._reference = None
        if reference is not None:  # copied before the policy's layers were compiled: compiled on its own
            self._reference = scoring_model(reference, forward, device, settings)
        self.rank = rank
        self.colocated = GeneratorWorker(self.model, colocated_engine, rank) if colocated_engine is not None else None
        self._sender: WeightSender | None = None
        self._first_pass_logprobs: torch.Tensor | None = None  # [B, S], filled by train_on_policy's forwards
        self.warm_up_compiled_layers()
        self._memory = PhasePeaks(next(self.model.parameters()).device)

    def _scoring_models(self) -> list[ScoringModel]:
        own = super()._scoring_models()
        return own if self._reference is None else [*own, self._reference]

    # -- training (the policy side of the PPO step) --
    def logprobs(self, batch: TrainBatch) -> torch.Tensor:
        """[B, S] fp32 on CPU: the current policy's `token_logprobs` under the sampling temperature, no grad."""
        return self.scoring.score(batch)

    def reference_logprobs(self, batch: TrainBatch) -> torch.Tensor:
        """[B, S] fp32 on CPU under the frozen reference policy; needs keep_reference."""
        if self._reference is None:
            raise ValueError("reference_logprobs needs a PolicyWorker built with keep_reference=True")
        return self._reference.score(batch)

    def _loss(self, micro: MicroBatch, normalizers: LossNormalizers) -> tuple[torch.Tensor, dict[str, float]]:
        batch = micro.batch
        assert batch.advantages is not None, "checked in train"
        logprobs = self.module(batch.input_ids, batch.attention_mask)
        old_logprobs = batch.old_logprobs
        if old_logprobs is None:  # train_on_policy: this forward's own values are the old logprobs
            old_logprobs = logprobs.detach()
            if not micro.stand_in:
                assert self._first_pass_logprobs is not None, "set by train_on_policy"
                self._first_pass_logprobs[micro.rows, : logprobs.shape[1]] = old_logprobs
        return policy_loss(
            self._loss_settings,
            logprobs=logprobs,
            old_logprobs=old_logprobs,
            generation_logprobs=batch.generation_logprobs,
            advantages=batch.advantages,
            token_mask=batch.token_mask,
            sample_mask=batch.sample_mask,
            global_valid_tokens=normalizers.valid_tokens,
            global_valid_seqs=normalizers.valid_seqs,
            reference_logprobs=batch.reference_logprobs,
            rewards=batch.rewards,
            global_positive_tokens=normalizers.positive_tokens,
        )

    def train(self, batch: TrainBatch) -> dict[str, float]:
        """One PPO pass over `batch` (one optimizer step per global batch); metrics prefixed `policy/`.

        Needs batch.old_logprobs and batch.advantages (and reference_logprobs when the loss has a reference KL).
        Metrics: the `policy_loss` metrics averaged over global batches, plus lr, grad_norm,
        num_optimizer_steps and num_empty_global_batches (see `training.train_pass`); colocated on CUDA also
        the `memory/*_peak_gib` of generation and training.
        """
        if batch.old_logprobs is None or batch.advantages is None:
            raise ValueError("PolicyWorker.train needs batch.old_logprobs and batch.advantages")
        if self._loss_settings.uses_reference_kl and batch.reference_logprobs is None:
            raise ValueError("PolicyWorker.train needs batch.reference_logprobs: the loss has a reference KL term")
        with self._memory.phase("train"):
            metrics = self._train_pass(batch, self._loss, _policy_normalizers)
        result = {f"policy/{key}": value for key, value in metrics.items()}
        if self.colocated is not None:  # the engine's KV cache and the training state share the GPU
            result.update(self._memory.report())
        return result

    def train_on_policy(self, batch: TrainBatch) -> tuple[dict[str, float], torch.Tensor]:
        """`train` without batch.old_logprobs: each micro-batch's own forward gives them (detached), and they are
        returned ([B, S] fp32 on CPU, every row) beside the metrics.

        Exact only when no weight changes before the last micro-batch's forward: the pass must be ONE global batch
        (the driver calls this for one PPO epoch with one global batch, see `builders.old_logprobs_from_training`);
        then the old logprobs a separate scoring pass would give are these forwards' values, and the PPO ratio of
        the pass is exactly 1. ValueError when the batch would take several optimizer steps.
        """
        if batch.advantages is None:
            raise ValueError("PolicyWorker.train_on_policy needs batch.advantages")
        if self.plan.global_batch_size is not None and self.plan.global_batch_size < len(batch):
            raise ValueError(
                f"train_on_policy needs one global batch, but train_global_batch_size={self.plan.global_batch_size} "
                f"cuts {len(batch)} samples into several optimizer steps; score old logprobs with `logprobs` first"
            )
        if self._loss_settings.uses_reference_kl and batch.reference_logprobs is None:
            raise ValueError("PolicyWorker.train_on_policy needs batch.reference_logprobs: the loss has a reference KL")
        device = next(self.model.parameters()).device
        self._first_pass_logprobs = torch.zeros(batch.input_ids.shape, dtype=torch.float32, device=device)
        try:
            with self._memory.phase("train"):
                metrics = self._train_pass(batch.with_fields(old_logprobs=None), self._loss, _policy_normalizers)
            # Every rank filled its own rows (stand-ins none): the sum over ranks is every row's logprobs.
            logprobs = sum_tensor_over_ranks(self._first_pass_logprobs, self.scoring.group).cpu()
        finally:
            self._first_pass_logprobs = None
        result = {f"policy/{key}": value for key, value in metrics.items()}
        if self.colocated is not None:
            result.update(self._memory.report())
        return result, logprobs

    def named_weights(self) -> Iterator[tuple[str, torch.Tensor]]:
        """(name, tensor) pairs a generator of the same architecture loads by name; see `ScoringModel.named_weights`."""
        return self.scoring.named_weights()

    # -- colocated generation --
    def _engine(self) -> GeneratorWorker:
        if self.colocated is None:
            raise RuntimeError("this policy worker has no colocated generator (generation.colocated.enabled=false)")
        return self.colocated

    def generate(self, requests: Sequence[GenerationRequest]) -> list[GenerationResult]:
        engine = self._engine()
        with self._memory.phase("generation"):
            return engine.generate(requests)

    def serve_http(self, settings: "PolicyServerSettings") -> str:
        """Serve the colocated generator to gym agents; returns the OpenAI base URL (`http://host:port/v1`)."""
        return self._engine().serve_http(settings)

    def policy_requests_received(self) -> int:
        return self._engine().policy_requests_received()

    def policy_version(self) -> int:
        return self._engine().policy_version()

    def set_policy_version(self, version: int) -> None:
        if self.colocated is not None:
            self.colocated.set_policy_version(version)

    def reseed(self, seed: int) -> None:
        if self.colocated is not None:
            self.colocated.reseed(seed)

    def engine_counters(self) -> dict[str, float]:
        """The colocated engine's cumulative prefix-reuse counters ({} for hf or without a generator)."""
        return self.colocated.engine_counters() if self.colocated is not None else {}

    # -- weight sync, sender side --
    def param_specs(self) -> list[ParamSpec]:
        return param_specs(self.named_weights())

    def open_sync(self, spec: SyncGroupSpec, specs: list[ParamSpec], bucket_size_bytes: int) -> None:
        """Join the weight-sync group as its sender (rank 0 of the policy group only). `specs`: this worker's
        `param_specs`, taken by the driver beforehand (in a data-parallel group every rank must gather for them).
        Called again after a generator restart: the old group is broken off first, which ends any transfer still
        waiting on it, so every generator can join the new one."""
        device = next(self.model.parameters()).device if spec.backend == "nccl" else torch.device("cpu")
        if self._sender is not None:
            self._sender.abort()
            self._sender = None
        self._sender = WeightSender(open_sync_group(spec, rank=0, device=device), specs, bucket_size_bytes)

    def push_weights(self, version: int, compute_checksum: bool) -> PushReport | None:
        """Rank 0 sends the weights to the generators; in a data-parallel group every other rank takes part in
        gathering each sharded tensor (a collective) and returns None."""
        if not self._is_writer():
            for _ in self.named_weights():
                pass
            return None
        if self._sender is None:
            raise RuntimeError("push_weights before open_sync")
        return self._sender.push(self.named_weights(), version, compute_checksum=compute_checksum)

    def weights_checksum(self) -> str:
        """Checksum of the weights as pushed (names and dtypes of `param_specs`)."""
        return weights_checksum(self.named_weights())

    def weights(self) -> dict[str, torch.Tensor]:
        """CPU copies of the weights as pushed (for inspection and tests; not a hot path)."""
        return {name: tensor.detach().cpu().clone() for name, tensor in self.named_weights()}

    def close(self) -> None:
        """Stop the colocated engine and close the weight-sync sender's group."""
        if self.colocated is not None:
            self.colocated.close()
        if self._sender is not None:
            self._sender.close()
