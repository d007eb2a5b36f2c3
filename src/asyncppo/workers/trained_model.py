"""A model under training: its scoring forward, AdamW, LR schedule, batch plan, and optimizer checkpoints.

The policy and value workers each own one and differ only in the forward, the loss and the weight format.
Checkpoint layout of a directory: the model's `save_pretrained` files, its tokenizer, `optimizer.pt` (keyed
by parameter name, so it loads into any number of ranks) and `scheduler.pt`, all loadable with
`torch.load(weights_only=True)`.
"""

from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_optimizer_state_dict,
    set_optimizer_state_dict,
)
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from asyncppo.config.models import OptimizerConfig, SchedulerConfig
from asyncppo.types import TrainBatch
from asyncppo.workers.data_parallel import broadcast_from_rank0
from asyncppo.workers.optim import build_optimizer, build_scheduler
from asyncppo.workers.scoring import ScoringModel, TokenForward
from asyncppo.workers.training import BatchPlan, LossFunction, Normalize, evaluate_pass, train_pass

OPTIMIZER_FILE = "optimizer.pt"
SCHEDULER_FILE = "scheduler.pt"


class TrainedModel:
    """`scoring` (model, forward, sharding) plus the optimizer state that `train` advances."""

    def __init__(
        self,
        model: PreTrainedModel,
        forward: TokenForward,
        *,
        device: torch.device,
        optimizer: OptimizerConfig,
        scheduler: SchedulerConfig,
        scheduler_total_steps: int | None,
        max_grad_norm: float | None,
        plan: BatchPlan,
        scoring_batch_size: int,
        activation_checkpointing: bool,
    ) -> None:
        if max_grad_norm is not None and not max_grad_norm > 0:
            raise ValueError(f"max_grad_norm must be > 0 or None, got {max_grad_norm}")
        if activation_checkpointing:
            # Non-reentrant checkpointing works with FSDP2 and with inputs that do not require grad.
            if hasattr(model, "activation_checkpointing_enable"):  # transformers >= 5 (the old name is deprecated)
                model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
            else:
                model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        self.scoring = ScoringModel(model, forward, device=device, scoring_batch_size=scoring_batch_size)
        self.optimizer_settings = optimizer
        self.scheduler_settings = scheduler
        self.scheduler_total_steps = scheduler_total_steps
        self.max_grad_norm = max_grad_norm
        self.plan = plan
        self.reset_optimizer()

    @property
    def model(self) -> PreTrainedModel:
        return self.scoring.model

    @property
    def module(self) -> torch.nn.Module:
        """The forward to call inside a loss function (so FSDP2's hooks run)."""
        return self.scoring.module

    def reset_optimizer(self) -> None:
        """A fresh AdamW (no moments, step 0) and a schedule back at its first step."""
        self.optimizer = build_optimizer(self.scoring.module.parameters(), self.optimizer_settings)
        self.scheduler = build_scheduler(self.optimizer, self.scheduler_settings, self.scheduler_total_steps)

    def train(self, batch: TrainBatch, loss_fn: LossFunction, normalize: Normalize) -> dict[str, float]:
        """One `training.train_pass` in train mode; the model is back in eval mode afterwards."""
        self.scoring.module.train()
        try:
            return train_pass(
                batch,
                loss_fn,
                normalize,
                plan=self.plan,
                optimizer=self.optimizer,
                scheduler=self.scheduler,
                max_grad_norm=self.max_grad_norm,
                device=self.scoring.device,
                group=self.scoring.group,
            )
        finally:
            self.scoring.module.eval()

    def evaluate(self, batch: TrainBatch, loss_fn: LossFunction, normalize: Normalize) -> dict[str, float]:
        """`training.evaluate_pass` in eval mode (no gradient, no step)."""
        self.scoring.module.eval()
        return evaluate_pass(
            batch, loss_fn, normalize, plan=self.plan, device=self.scoring.device, group=self.scoring.group
        )

    def _is_writer(self) -> bool:
        return self.scoring.group is None or self.scoring.group.rank == 0

    def save(self, directory: str | Path, tokenizer: PreTrainedTokenizerBase) -> Path:
        """Write weights (safetensors via save_pretrained), tokenizer, optimizer and scheduler into `directory`.

        In a group every rank must call (the full state is gathered); rank 0 writes.
        """
        directory = Path(directory)
        group = self.scoring.group
        state = self.scoring.full_state_dict()
        options = StateDictOptions(full_state_dict=group is not None, cpu_offload=group is not None)
        optimizer_state = get_optimizer_state_dict(self.model, self.optimizer, options=options)
        if self._is_writer():
            directory.mkdir(parents=True, exist_ok=True)
            self.model.save_pretrained(directory, state_dict=state)
            tokenizer.save_pretrained(directory)
            torch.save(optimizer_state, directory / OPTIMIZER_FILE)
            torch.save(self.scheduler.state_dict(), directory / SCHEDULER_FILE)
        if group is not None:
            dist.barrier()  # no rank reads the directory before it is complete
        return directory

    def load(self, directory: str | Path, read_weights: Callable[[Path], dict[str, Any]], load_optimizer: bool) -> None:
        """Weights from `directory` (as `read_weights` reads them); then the optimizer and scheduler states from
        its files, or, without `load_optimizer`, a fresh optimizer and schedule (never stale moments from
        other weights). Every rank of a group must call; only rank 0 reads files.
        """
        directory = Path(directory)
        group = self.scoring.group
        if load_optimizer:
            files = (OPTIMIZER_FILE, SCHEDULER_FILE)
            missing = [name for name in files if not (directory / name).is_file()] if self._is_writer() else []
            # Every rank raises together; one rank raising alone would leave the others waiting in a collective.
            if missing := broadcast_from_rank0(missing, group):
                raise ValueError(f"{str(directory)!r} lacks {missing}; load it with load_optimizer=False")
        self.scoring.load_weights(read_weights, directory)
        self.reset_optimizer()
        if not load_optimizer:
            return
        optimizer_state = torch.load(directory / OPTIMIZER_FILE, weights_only=True) if self._is_writer() else {}
        options = StateDictOptions(full_state_dict=group is not None, broadcast_from_rank0=group is not None)
        set_optimizer_state_dict(self.model, self.optimizer, optimizer_state, options=options)
        scheduler_state = torch.load(directory / SCHEDULER_FILE, weights_only=True) if self._is_writer() else None
        scheduler_state = broadcast_from_rank0(scheduler_state, group)
        assert isinstance(scheduler_state, dict), f"{SCHEDULER_FILE} holds {type(scheduler_state).__name__}"
        self.scheduler.load_state_dict(scheduler_state)
