"""ValueWorker: the trained critic, in-process; a Ray shell wraps it per device.

Called by the driver's PPO step (values before any update, critic passes, the post-update re-score) and by the
checkpointer (`save`, `load`, `warm_start` from an offline-pretrained critic). Letters: B samples, S positions.
"""

from pathlib import Path

import torch
from transformers import PreTrainedModel

from asyncppo.algorithms.microbatch import LossNormalizers, loss_normalizers
from asyncppo.algorithms.value_loss import explained_variance_from_stats, value_loss
from asyncppo.config.losses import ValueLossConfig
from asyncppo.config.models import OptimizerConfig, SchedulerConfig
from asyncppo.models.tokenizer import load_tokenizer
from asyncppo.models.value import load_value_model, values
from asyncppo.types import TrainBatch
from asyncppo.workers.scoring import resolve_dtype
from asyncppo.workers.trained_model import TrainedModel
from asyncppo.workers.training import BatchPlan, LossFunction, MicroBatch

Offsets = tuple[torch.Tensor, torch.Tensor]
"""(returns_to_abs, returns_to_res), [B] each: move returns into the absolute and the residual space."""


def _critic_masks(batch: TrainBatch) -> tuple[torch.Tensor, torch.Tensor]:
    """(token mask [B, S], sample mask [B]) the critic is supervised on: its own copies when the driver set them."""
    token_mask = batch.critic_mask if batch.critic_mask is not None else batch.token_mask
    sample_mask = batch.critic_sample_mask if batch.critic_sample_mask is not None else batch.sample_mask
    return token_mask, sample_mask


def _critic_normalizers(batch: TrainBatch) -> LossNormalizers:
    return loss_normalizers(*_critic_masks(batch))


class ValueWorker:
    """The critic (backbone + scalar head, right-shifted values) and its optimizer."""

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
        loss_settings: ValueLossConfig,
        activation_checkpointing: bool,
    ) -> None:
        """Load the critic from `model_path`: a causal LM (zero head) or a saved value model.

        logprob_batch_size (rows per no-grad forward of `values`) None = train_micro_batch_size.
        """
        self._dtype = resolve_dtype(dtype)
        self._device = torch.device(device)
        self._loss_settings = loss_settings
        self.tokenizer = load_tokenizer(tokenizer_path if tokenizer_path is not None else model_path)
        self._trained = TrainedModel(
            load_value_model(model_path, self._dtype, self._device),
            values,
            device=self._device,
            optimizer=optimizer,
            scheduler=scheduler,
            scheduler_total_steps=scheduler_total_steps,
            max_grad_norm=max_grad_norm,
            plan=BatchPlan(train_global_batch_size, train_micro_batch_size, max_tokens_per_microbatch),
            scoring_batch_size=logprob_batch_size if logprob_batch_size is not None else train_micro_batch_size,
            activation_checkpointing=activation_checkpointing,
        )

    @property
    def model(self) -> PreTrainedModel:
        """The Hugging Face `*ForSequenceClassification` critic (FSDP2-sharded in a multi-rank group)."""
        return self._trained.model

    @property
    def optimizer(self) -> torch.optim.Optimizer:
        return self._trained.optimizer

    @property
    def scheduler(self) -> torch.optim.lr_scheduler.LRScheduler:
        return self._trained.scheduler

    def values(self, batch: TrainBatch) -> torch.Tensor:
        """[B, S] fp32 on CPU, right-shifted (values[:, t] = V(state before token t)), no grad."""
        return self._trained.scoring.score(batch)

    def _loss_function(self, offsets: Offsets | None) -> LossFunction:
        def loss(micro: MicroBatch, normalizers: LossNormalizers) -> tuple[torch.Tensor, dict[str, float]]:
            batch = micro.batch
            assert batch.returns is not None, "checked in train"
            token_mask, sample_mask = _critic_masks(batch)
            predicted = self._trained.module(batch.input_ids, batch.attention_mask)
            # Without clipping the old values are never read; the loss only checks their shape.
            old_values = batch.values if batch.values is not None else batch.returns
            to_abs, to_res = (None, None) if offsets is None else (offset[micro.rows] for offset in offsets)
            return value_loss(
                self._loss_settings,
                values=predicted,
                old_values=old_values,
                returns=batch.returns,
                token_mask=token_mask,
                sample_mask=sample_mask,
                global_valid_tokens=normalizers.valid_tokens,
                returns_to_abs=None if to_abs is None else to_abs.to(predicted.device),
                returns_to_res=None if to_res is None else to_res.to(predicted.device),
            )

        return loss

    def train(self, batch: TrainBatch, *, offsets: Offsets | None = None, eval_only: bool = False) -> dict[str, float]:
        """One critic pass over `batch` (one optimizer step per global batch), or with eval_only a forward-only
        re-score of the whole batch (no step); metrics prefixed `critic/`.

        Needs batch.returns, and batch.values (the rollout-time values) when the loss clips. Supervised where
        batch.critic_mask x batch.critic_sample_mask (token_mask x sample_mask when unset). offsets: the [B]
        return-space offsets for the two-space statistics (zeros when None).
        Metrics: the `value_loss` metrics (averaged over global batches; one global batch when eval_only),
        `explained_var` / `explained_var_res` rebuilt from those summed statistics
        (`explained_variance_from_stats`, abs and residual space), plus lr, grad_norm, num_optimizer_steps and
        num_empty_global_batches when training. These EVs describe the critic as it is being (or has been)
        updated; the pre-update EV is the driver's.
        """
        if batch.returns is None:
            raise ValueError("ValueWorker.train needs batch.returns")
        if self._loss_settings.cliprange is not None and batch.values is None:
            raise ValueError("ValueWorker.train needs batch.values (rollout-time values) to clip the value loss")
        if offsets is not None and not all(offset.shape == (len(batch),) for offset in offsets):
            raise ValueError(f"offsets must be two [B={len(batch)}] tensors, got {[tuple(o.shape) for o in offsets]}")
        loss = self._loss_function(offsets)
        if eval_only:
            metrics = self._trained.evaluate(batch, loss, _critic_normalizers)
        else:
            metrics = self._trained.train(batch, loss, _critic_normalizers)
        if "residual_sq_mean" in metrics:
            explained = explained_variance_from_stats(metrics)
            metrics["explained_var"] = explained["ev_abs"]
            metrics["explained_var_res"] = explained["ev_res"]
        return {f"critic/{key}": value for key, value in metrics.items()}

    def save(self, directory: str | Path) -> Path:
        """`directory` with the critic (AutoModelForSequenceClassification format), tokenizer, optimizer.pt and
        scheduler.pt."""
        return self._trained.save(directory, self.tokenizer)

    def _read_weights(self, directory: Path) -> dict[str, torch.Tensor]:
        return load_value_model(directory, self._dtype, "cpu").state_dict()

    def load(self, directory: str | Path, load_optimizer: bool = True) -> None:
        """Weights (and, with load_optimizer, optimizer and scheduler states) from a `save` directory (resume)."""
        self._trained.load(directory, self._read_weights, load_optimizer)

    def warm_start(self, directory: str | Path) -> None:
        """Critic weights from `directory` (e.g. an offline-pretrained critic) with a fresh optimizer and LR
        schedule: a warm start never carries optimizer state (the warmup re-warms from step 0)."""
        self._trained.load(directory, self._read_weights, load_optimizer=False)
