"""A model under training: its scoring forward, AdamW, LR schedule, batch plan, and optimizer checkpoints.

The policy and value workers are both a `TrainedWorker` (built from `TrainedModelSettings`) and differ only
in the forward, the loss and the weight format. Checkpoint layout of a directory: the model's `save_pretrained`
files, its tokenizer, `optimizer.pt` (keyed by parameter name, so it loads into any number of ranks) and
`scheduler.pt`, all loadable with `torch.load(weights_only=True)`.
"""

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_optimizer_state_dict,
    set_optimizer_state_dict,
)
from transformers import PreTrainedModel

from asyncppo.config.models import OptimizerConfig, SchedulerConfig
from asyncppo.models.compiled_layers import compile_decoder_layers
from asyncppo.models.tokenizer import load_tokenizer
from asyncppo.types import TrainBatch
from asyncppo.workers.data_parallel import broadcast_from_rank0, sum_over_ranks
from asyncppo.workers.microbatches import TokenTally
from asyncppo.workers.optim import apply_optimizer_settings, build_optimizer, build_scheduler
from asyncppo.workers.scoring import ScoringModel, TokenForward
from asyncppo.workers.training import BatchPlan, LossFunction, Normalize, evaluate_pass, train_pass

OPTIMIZER_FILE = "optimizer.pt"
SCHEDULER_FILE = "scheduler.pt"
WARM_UP_TOKENS = 8192
"""Most tokens of the made-up micro-batch that compiles the layers at start-up (fewer under a smaller budget)."""

ReadWeights = Callable[[Path], dict[str, Any]]
"""Reads a saved directory's weights as a CPU state dict (the worker's own weight format)."""


@dataclass(frozen=True, kw_only=True)
class TrainedModelSettings:
    """How a trained model (policy or critic) is loaded, optimized and cut into batches."""

    dtype: torch.dtype | str
    tokenizer_path: str | Path | None
    """None = the model's own directory."""
    optimizer: OptimizerConfig
    scheduler: SchedulerConfig
    scheduler_total_steps: int | None
    max_grad_norm: float | None
    train_global_batch_size: int | None
    train_micro_batch_size: int
    max_tokens_per_microbatch: int | None
    sequence_packing: bool | Literal["auto"]
    """Forwards run the real tokens back to back (`models/packing.py`; `auto` = on CUDA devices); the token budget
    then counts real tokens."""
    logprob_batch_size: int | None
    """Rows per no-grad scoring forward; None = train_micro_batch_size."""
    activation_checkpointing: bool
    compile: bool | Literal["auto"] = False
    """Compile the decoder layers for the training and scoring forwards (`models/compiled_layers.py`; `auto` = on
    CUDA devices). The one field with a default here: settings built by hand (tests, scripts) stay eager, and a run
    takes the config schema's value (`auto`)."""

    def packs_on(self, device: torch.device) -> bool:
        """Whether forwards on `device` pack their rows (sequence_packing resolved)."""
        return self.sequence_packing is True or (self.sequence_packing == "auto" and device.type == "cuda")

    def compiles_on(self, device: torch.device) -> bool:
        """Whether the decoder layers are compiled on `device` (compile resolved)."""
        return self.compile is True or (self.compile == "auto" and device.type == "cuda")

    def plan_on(self, device: torch.device) -> BatchPlan:
        return BatchPlan(
            self.train_global_batch_size,
            self.train_micro_batch_size,
            self.max_tokens_per_microbatch,
            self.packs_on(device),
        )

    @property
    def scoring_batch_size(self) -> int:
        return self.logprob_batch_size if self.logprob_batch_size is not None else self.train_micro_batch_size


def scoring_model(
    model: PreTrainedModel, forward: TokenForward, device: torch.device, settings: TrainedModelSettings
) -> ScoringModel:
    """`model` (its decoder layers compiled when the settings say so on `device`) as a ScoringModel with the
    settings' scoring batch size and packing."""
    if settings.compiles_on(device):
        compile_decoder_layers(model)
    return ScoringModel(
        model, forward, device=device, scoring_batch_size=settings.scoring_batch_size, packed=settings.packs_on(device)
    )


class TrainedWorker:
    """What the policy and value workers share: `scoring` (model, forward, sharding), the optimizer state that
    their passes advance, the tokenizer, and the checkpoint files.

    A subclass loads its model and passes the forward and the reader of its weight format; its own `train`
    runs `_train_pass` with its loss.
    """

    def __init__(
        self,
        model: PreTrainedModel,
        forward: TokenForward,
        read_weights: ReadWeights,
        *,
        model_path: str | Path,
        device: torch.device,
        settings: TrainedModelSettings,
    ) -> None:
        tokenizer_path = settings.tokenizer_path
        self.tokenizer = load_tokenizer(tokenizer_path if tokenizer_path is not None else model_path)
        self._read_weights = read_weights
        max_grad_norm = settings.max_grad_norm
        if max_grad_norm is not None and not max_grad_norm > 0:
            raise ValueError(f"max_grad_norm must be > 0 or None, got {max_grad_norm}")
        if settings.activation_checkpointing:
            # Non-reentrant checkpointing works with FSDP2 and with inputs that do not require grad.
            if hasattr(model, "activation_checkpointing_enable"):  # transformers >= 5 (the old name is deprecated)
                model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
            else:
                model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        self.scoring = scoring_model(model, forward, device, settings)
        self.settings = settings
        self.plan = settings.plan_on(device)
        self.reset_optimizer()

    @property
    def model(self) -> PreTrainedModel:
        """The trained Hugging Face model (FSDP2-sharded in a multi-rank group)."""
        return self.scoring.model

    @property
    def module(self) -> torch.nn.Module:
        """The forward to call inside a loss function (so FSDP2's hooks run)."""
        return self.scoring.module

    def reset_optimizer(self) -> None:
        """A fresh AdamW (no moments, step 0) and a schedule back at its first step."""
        settings = self.settings
        self.optimizer = build_optimizer(self.scoring.module.parameters(), settings.optimizer)
        self.scheduler = build_scheduler(self.optimizer, settings.scheduler, settings.scheduler_total_steps)

    def _scoring_models(self) -> list[ScoringModel]:
        """This worker's no-grad scoring models (the policy adds its reference)."""
        return [self.scoring]

    def _scoring_tallies(self) -> list[TokenTally]:
        """The token tallies of this worker's no-grad scoring models."""
        return [model.scored for model in self._scoring_models()]

    def warm_up_compiled_layers(self) -> float:
        """Compile the layers now, while the run starts, instead of in the first step; returns the seconds taken
        (0.0 when the layers run eagerly).

        Each graph a step will call runs once on made-up tokens: the trained model's forward and backward in
        train mode, and every scoring model's forward without grad. The workers build at the same time as the
        generators, whose engine compiles and captures its own graphs, so this compile overlaps theirs rather
        than stalling step 1 (measured on the `trl` bench: its first step paid ~23 s of compile). Nothing a step
        reads changes: gradients are dropped, no optimizer step runs, and the tokens come from a generator of
        their own (the global RNG is not drawn from). Every rank of a group calls it (the forwards are
        collectives), with the same shapes.
        """
        device = self.scoring.device
        if not self.settings.compiles_on(device):
            return 0.0
        started = time.perf_counter()
        budget = self.settings.max_tokens_per_microbatch
        total = min(WARM_UP_TOKENS, budget) if budget is not None else WARM_UP_TOKENS
        # Two rows of different lengths (a size of 1 would be specialised by the compiler, not kept dynamic).
        lengths = (total - total // 3, total // 3)
        vocab_size = int(self.model.config.vocab_size)
        made_up = torch.Generator().manual_seed(0)
        input_ids = torch.randint(vocab_size, (len(lengths), lengths[0]), generator=made_up)
        attention_mask = torch.zeros_like(input_ids)
        for row, length in enumerate(lengths):
            attention_mask[row, :length] = 1
        input_ids, attention_mask = input_ids.to(device), attention_mask.to(device)
        module = self.scoring.module
        module.train()
        try:
            module(input_ids, attention_mask).sum().backward()
        finally:
            module.eval()
            self.optimizer.zero_grad(set_to_none=True)
        with torch.no_grad():
            for scoring in self._scoring_models():
                scoring.module(input_ids, attention_mask)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        return time.perf_counter() - started

    def _take_scored_counts(self) -> dict[str, float]:
        """`scored_tokens_computed` / `scored_tokens_real` of the scoring since the last call, summed over ranks."""
        counts = [tally.take() for tally in self._scoring_tallies()]
        computed, real = sum_over_ranks([sum(c for c, _ in counts), sum(r for _, r in counts)], self.scoring.group)
        return {"scored_tokens_computed": float(computed), "scored_tokens_real": float(real)}

    def _train_pass(self, batch: TrainBatch, loss_fn: LossFunction, normalize: Normalize) -> dict[str, float]:
        """One `training.train_pass` in train mode (the model is back in eval mode afterwards), plus the token
        counts of the scoring since the previous pass (`_take_scored_counts`)."""
        scored = self._take_scored_counts()
        self.scoring.module.train()
        try:
            return scored | train_pass(
                batch,
                loss_fn,
                normalize,
                plan=self.plan,
                optimizer=self.optimizer,
                scheduler=self.scheduler,
                max_grad_norm=self.settings.max_grad_norm,
                device=self.scoring.device,
                group=self.scoring.group,
            )
        finally:
            self.scoring.module.eval()

    def _evaluate_pass(self, batch: TrainBatch, loss_fn: LossFunction, normalize: Normalize) -> dict[str, float]:
        """`training.evaluate_pass` in eval mode (no gradient, no step)."""
        self.scoring.module.eval()
        return evaluate_pass(
            batch, loss_fn, normalize, plan=self.plan, device=self.scoring.device, group=self.scoring.group
        )

    def _is_writer(self) -> bool:
        return self.scoring.group is None or self.scoring.group.rank == 0

    def save(self, directory: str | Path) -> Path:
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
            self.tokenizer.save_pretrained(directory)
            torch.save(optimizer_state, directory / OPTIMIZER_FILE)
            torch.save(self.scheduler.state_dict(), directory / SCHEDULER_FILE)
        if group is not None:
            dist.barrier()  # no rank reads the directory before it is complete
        return directory

    def load(self, directory: str | Path, load_optimizer: bool = True) -> None:
        """Weights from `directory` (in the subclass's weight format); then the optimizer and scheduler states from
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
        self.scoring.load_weights(self._read_weights, directory)
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
        apply_optimizer_settings(self.optimizer, self.scheduler, self.settings.optimizer)
