"""ValueWorker: the trained critic, the value role of the run, one per rank.

Called through `workers/groups.py` by the driver's PPO step (values before any update, critic passes with
`train`, the post-update re-score with `evaluate`) and by the checkpointer (`save`, `load`, `warm_start` from an
offline-pretrained critic); usable in-process as well (tests). Letters: B samples, S positions.
"""

from dataclasses import dataclass
from pathlib import Path

import torch

from asyncppo.algorithms.microbatch import LossNormalizers, loss_normalizers
from asyncppo.algorithms.value_loss import explained_variance_from_stats, value_loss
from asyncppo.config.losses import ValueLossConfig
from asyncppo.models.value import load_value_model, values
from asyncppo.types import TrainBatch
from asyncppo.workers.scoring import resolve_dtype
from asyncppo.workers.trained_model import TrainedModelSettings, TrainedWorker
from asyncppo.workers.training import LossFunction, MicroBatch

Offsets = tuple[torch.Tensor, torch.Tensor]
"""(returns_to_abs, returns_to_res), [B] each: move returns into the absolute and the residual space."""


@dataclass(frozen=True, kw_only=True)
class ValueWorkerSettings(TrainedModelSettings):
    """The critic's own settings on top of the trained-model ones."""

    loss_settings: ValueLossConfig


def _critic_masks(batch: TrainBatch) -> tuple[torch.Tensor, torch.Tensor]:
    """(token mask [B, S], sample mask [B]) the critic is supervised on: its own copies when the driver set them."""
    token_mask = batch.critic_mask if batch.critic_mask is not None else batch.token_mask
    sample_mask = batch.critic_sample_mask if batch.critic_sample_mask is not None else batch.sample_mask
    return token_mask, sample_mask


def _critic_normalizers(batch: TrainBatch) -> LossNormalizers:
    return loss_normalizers(*_critic_masks(batch))


class ValueWorker(TrainedWorker):
    """The critic (backbone + scalar head, right-shifted values) and its optimizer."""

    def __init__(self, model_path: str | Path, device: str | torch.device, settings: ValueWorkerSettings) -> None:
        """Load the critic from `model_path`: a causal LM (zero head) or a saved value model."""
        dtype, device = resolve_dtype(settings.dtype), torch.device(device)
        self._loss_settings = settings.loss_settings

        def read_weights(directory: Path) -> dict[str, torch.Tensor]:
            return load_value_model(directory, dtype, "cpu").state_dict()

        model = load_value_model(model_path, dtype, device)
        super().__init__(model, values, read_weights, model_path=model_path, device=device, settings=settings)
        self.warm_up_compiled_layers()

    def values(self, batch: TrainBatch) -> torch.Tensor:
        """[B, S] fp32 on CPU, right-shifted (values[:, t] = V(state before token t)), no grad."""
        return self.scoring.score(batch)

    def _loss_function(self, offsets: Offsets | None) -> LossFunction:
        def loss(micro: MicroBatch, normalizers: LossNormalizers) -> tuple[torch.Tensor, dict[str, float]]:
            batch = micro.batch
            assert batch.returns is not None, "checked in train"
            token_mask, sample_mask = _critic_masks(batch)
            predicted = self.module(batch.input_ids, batch.attention_mask)
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

    def _checked_loss(self, batch: TrainBatch, offsets: Offsets | None, method: str) -> LossFunction:
        if batch.returns is None:
            raise ValueError(f"ValueWorker.{method} needs batch.returns")
        if self._loss_settings.cliprange is not None and batch.values is None:
            raise ValueError(f"ValueWorker.{method} needs batch.values (rollout-time values) to clip the value loss")
        if offsets is not None and not all(offset.shape == (len(batch),) for offset in offsets):
            raise ValueError(f"offsets must be two [B={len(batch)}] tensors, got {[tuple(o.shape) for o in offsets]}")
        return self._loss_function(offsets)

    def train(self, batch: TrainBatch, offsets: Offsets | None = None) -> dict[str, float]:
        """One critic pass over `batch` (one optimizer step per global batch); metrics prefixed `critic/`.

        Needs batch.returns, and batch.values (the rollout-time values) when the loss clips. Supervised where
        batch.critic_mask x batch.critic_sample_mask (token_mask x sample_mask when unset). offsets: the [B]
        return-space offsets for the two-space statistics (zeros when None).
        Metrics: the `value_loss` metrics averaged over global batches, `explained_var` / `explained_var_res`
        rebuilt from those summed statistics (`explained_variance_from_stats`, abs and residual space), plus lr,
        grad_norm, num_optimizer_steps and num_empty_global_batches. These EVs describe the critic as it is
        being updated; the pre-update EV is the driver's.
        """
        loss = self._checked_loss(batch, offsets, "train")
        return _critic_metrics(self._train_pass(batch, loss, _critic_normalizers))

    def evaluate(self, batch: TrainBatch, offsets: Offsets | None = None) -> dict[str, float]:
        """The metrics of `train` from a forward-only re-score of the whole batch as one global batch: no
        gradient, no optimizer step (the post-update critic diagnostics). Same inputs as `train`."""
        loss = self._checked_loss(batch, offsets, "evaluate")
        return _critic_metrics(self._evaluate_pass(batch, loss, _critic_normalizers))

    def warm_start(self, directory: str | Path) -> None:
        """Critic weights from `directory` (e.g. an offline-pretrained critic) with a fresh optimizer and LR
        schedule: a warm start never carries optimizer state (the warmup re-warms from step 0)."""
        self.load(directory, load_optimizer=False)


def _critic_metrics(metrics: dict[str, float]) -> dict[str, float]:
    """A pass's loss metrics plus the explained variances rebuilt from its summed statistics, prefixed `critic/`."""
    if "residual_sq_mean" in metrics:
        explained = explained_variance_from_stats(metrics)
        metrics["explained_var"] = explained["ev_abs"]
        metrics["explained_var_res"] = explained["ev_res"]
    return {f"critic/{key}": value for key, value in metrics.items()}
