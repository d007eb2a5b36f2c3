"""PolicyWorker: the trained policy (and its frozen reference), in-process; a Ray shell wraps it per device.

Called by the driver's PPO step (old and reference logprobs, then `train` once per ppo_epoch), by weight sync
(`named_weights`) and by the checkpointer (`save` / `load`). A colocated generator shares `model`.
Letters: B samples, S positions.
"""

import copy
import functools
from collections.abc import Iterator
from pathlib import Path

import torch
from transformers import PreTrainedModel

from asyncppo.algorithms.microbatch import LossNormalizers, loss_normalizers
from asyncppo.algorithms.policy_loss import policy_loss
from asyncppo.config.losses import PolicyLossConfig
from asyncppo.config.models import OptimizerConfig, SchedulerConfig
from asyncppo.models.policy import load_policy, token_logprobs
from asyncppo.models.tokenizer import load_tokenizer
from asyncppo.types import TrainBatch
from asyncppo.workers.scoring import ScoringModel, resolve_dtype
from asyncppo.workers.trained_model import TrainedModel
from asyncppo.workers.training import BatchPlan, MicroBatch


def _policy_normalizers(batch: TrainBatch) -> LossNormalizers:
    return loss_normalizers(batch.token_mask, batch.sample_mask, batch.rewards)


class PolicyWorker:
    """The policy under PPO, its optimizer, and (with `keep_reference`) a frozen copy of its initial weights."""

    def __init__(
        self,
        model_path: str | Path,
        *,
        dtype: torch.dtype | str,
        device: str | torch.device,
        tokenizer_path: str | Path | None,
        optimizer: OptimizerConfig,
        scheduler: SchedulerConfig,
        scheduler_total_steps: int | None,
        max_grad_norm: float | None,
        train_global_batch_size: int | None,
        train_micro_batch_size: int,
        max_tokens_per_microbatch: int | None,
        logprob_batch_size: int | None,
        temperature: float,
        logprob_chunk_size: int,
        loss_settings: PolicyLossConfig,
        keep_reference: bool,
        activation_checkpointing: bool,
    ) -> None:
        """Load the policy from `model_path` (a local causal LM directory) onto `device` in `dtype`.

        logprob_batch_size None = train_micro_batch_size. The reference policy is the weights of `model_path`;
        a later `load` (resume) changes only the trained policy, so the reference stays the initial policy.
        """
        if temperature <= 0:
            raise ValueError(f"temperature must be > 0, got {temperature}")
        self._dtype = resolve_dtype(dtype)
        self._device = torch.device(device)
        self._loss_settings = loss_settings
        self.tokenizer = load_tokenizer(tokenizer_path if tokenizer_path is not None else model_path)
        policy = load_policy(model_path, self._dtype, self._device)
        reference = copy.deepcopy(policy).requires_grad_(False) if keep_reference else None
        forward = functools.partial(token_logprobs, temperature=temperature, chunk_size=logprob_chunk_size)
        scoring_batch_size = logprob_batch_size if logprob_batch_size is not None else train_micro_batch_size
        self._trained = TrainedModel(
            policy,
            forward,
            device=self._device,
            optimizer=optimizer,
            scheduler=scheduler,
            scheduler_total_steps=scheduler_total_steps,
            max_grad_norm=max_grad_norm,
            plan=BatchPlan(train_global_batch_size, train_micro_batch_size, max_tokens_per_microbatch),
            scoring_batch_size=scoring_batch_size,
            activation_checkpointing=activation_checkpointing,
        )
        self._reference = None
        if reference is not None:
            self._reference = ScoringModel(
                reference, forward, device=self._device, scoring_batch_size=scoring_batch_size
            )

    @property
    def model(self) -> PreTrainedModel:
        """The trained Hugging Face causal LM (FSDP2-sharded in a multi-rank group)."""
        return self._trained.model

    @property
    def optimizer(self) -> torch.optim.Optimizer:
        return self._trained.optimizer

    @property
    def scheduler(self) -> torch.optim.lr_scheduler.LRScheduler:
        return self._trained.scheduler

    def logprobs(self, batch: TrainBatch) -> torch.Tensor:
        """[B, S] fp32 on CPU: the current policy's `token_logprobs` under the sampling temperature, no grad."""
        return self._trained.scoring.score(batch)

    def reference_logprobs(self, batch: TrainBatch) -> torch.Tensor:
        """[B, S] fp32 on CPU under the frozen reference policy; needs keep_reference."""
        if self._reference is None:
            raise ValueError("reference_logprobs needs a PolicyWorker built with keep_reference=True")
        return self._reference.score(batch)

    def _loss(self, micro: MicroBatch, normalizers: LossNormalizers) -> tuple[torch.Tensor, dict[str, float]]:
        batch = micro.batch
        assert batch.old_logprobs is not None and batch.advantages is not None, "checked in train"
        return policy_loss(
            self._loss_settings,
            logprobs=self._trained.module(batch.input_ids, batch.attention_mask),
            old_logprobs=batch.old_logprobs,
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
        num_optimizer_steps and num_empty_global_batches (see `training.train_pass`).
        """
        if batch.old_logprobs is None or batch.advantages is None:
            raise ValueError("PolicyWorker.train needs batch.old_logprobs and batch.advantages")
        if self._loss_settings.uses_reference_kl and batch.reference_logprobs is None:
            raise ValueError("PolicyWorker.train needs batch.reference_logprobs: the loss has a reference KL term")
        metrics = self._trained.train(batch, self._loss, _policy_normalizers)
        return {f"policy/{key}": value for key, value in metrics.items()}

    def named_weights(self) -> Iterator[tuple[str, torch.Tensor]]:
        """(name, tensor) pairs a generator of the same architecture loads by name; see `ScoringModel.named_weights`."""
        return self._trained.scoring.named_weights()

    def save(self, directory: str | Path) -> Path:
        """`directory` with the policy (save_pretrained, safetensors), tokenizer, optimizer.pt and scheduler.pt."""
        return self._trained.save(directory, self.tokenizer)

    def _read_weights(self, directory: Path) -> dict[str, torch.Tensor]:
        return load_policy(directory, self._dtype, "cpu").state_dict()

    def load(self, directory: str | Path, load_optimizer: bool = True) -> None:
        """Weights (and, with load_optimizer, optimizer and scheduler states) from a `save` directory.

        Without load_optimizer the optimizer and schedule start fresh. The reference policy is not touched.
        """
        self._trained.load(directory, self._read_weights, load_optimizer)
