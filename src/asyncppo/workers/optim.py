"""AdamW and the learning-rate schedule of the training workers, built from plain settings.

The policy and value workers call `build_optimizer` and `build_scheduler` when they start, after a warm start and
after `load(..., load_optimizer=False)`. The schedule is a multiplier of the peak LR, ticked once per optimizer step.
"""

import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

import torch
from torch import nn
from torch.optim.lr_scheduler import LambdaLR

ScheduleName = Literal["constant", "linear", "cosine"]


@dataclass(frozen=True)
class OptimizerSettings:
    """AdamW hyperparameters (the `optimizer` config keys as plain values)."""

    lr: float
    weight_decay: float
    betas: tuple[float, float]
    eps: float

    def __post_init__(self) -> None:
        if not self.lr > 0:
            raise ValueError(f"optimizer.lr must be > 0, got {self.lr}")
        if self.weight_decay < 0:
            raise ValueError(f"optimizer.weight_decay must be >= 0, got {self.weight_decay}")
        if len(self.betas) != 2 or not all(0 <= beta < 1 for beta in self.betas):
            raise ValueError(f"optimizer.betas must be two values in [0, 1), got {self.betas}")
        if not self.eps > 0:
            raise ValueError(f"optimizer.eps must be > 0, got {self.eps}")


@dataclass(frozen=True)
class SchedulerSettings:
    """Learning-rate schedule (the `scheduler` config keys as plain values)."""

    name: ScheduleName
    warmup_steps: int
    total_steps: int | None
    """Optimizer steps over which linear/cosine decay runs (warmup included); None = the worker's default."""
    min_lr_ratio: float

    def __post_init__(self) -> None:
        if self.name not in ("constant", "linear", "cosine"):
            raise ValueError(f"scheduler.name={self.name!r}: use constant, linear or cosine")
        if self.warmup_steps < 0:
            raise ValueError(f"scheduler.warmup_steps must be >= 0, got {self.warmup_steps}")
        if self.total_steps is not None and self.total_steps < 1:
            raise ValueError(f"scheduler.total_steps must be >= 1 or None, got {self.total_steps}")
        if not 0 <= self.min_lr_ratio <= 1:
            raise ValueError(f"scheduler.min_lr_ratio must lie in [0, 1], got {self.min_lr_ratio}")


def build_optimizer(parameters: Iterable[nn.Parameter], settings: OptimizerSettings) -> torch.optim.AdamW:
    """AdamW over the parameters that require grad; the fused CUDA kernel when they live on CUDA.

    On CPU torch picks its default (foreach) implementation. Fused and foreach give the same math up to
    rounding, so a checkpoint written by one loads into the other.
    """
    trainable = [parameter for parameter in parameters if parameter.requires_grad]
    if not trainable:
        raise ValueError("build_optimizer: no parameter requires grad")
    on_cuda = all(parameter.device.type == "cuda" for parameter in trainable)
    return torch.optim.AdamW(
        trainable,
        lr=settings.lr,
        betas=settings.betas,
        eps=settings.eps,
        weight_decay=settings.weight_decay,
        fused=True if on_cuda else None,
    )


def lr_multiplier(step: int, settings: SchedulerSettings, total_steps: int | None) -> float:
    """Fraction of the peak LR used by optimizer step `step` (0-based: the number of steps already taken).

    warmup (step < W):   step / W   (from 0; the first step runs at LR 0 and only fills Adam's moments,
                                     as in Megatron and transformers' schedules)
    after warmup, with progress p = min((step - W) / max(T - W, 1), 1) and floor m = min_lr_ratio:
      constant   1
      linear     m + (1 - m) (1 - p)
      cosine     m + (1 - m) (1 + cos(pi p)) / 2
    T = total_steps (the decay ends there; later steps stay at m).
    """
    warmup = settings.warmup_steps
    if step < warmup:
        return step / warmup
    if settings.name == "constant":
        return 1.0
    assert total_steps is not None, "resolved by build_scheduler"
    progress = min((step - warmup) / max(total_steps - warmup, 1), 1.0)
    floor = settings.min_lr_ratio
    if settings.name == "linear":
        return floor + (1.0 - floor) * (1.0 - progress)
    return floor + (1.0 - floor) * 0.5 * (1.0 + math.cos(math.pi * progress))


def build_scheduler(
    optimizer: torch.optim.Optimizer, settings: SchedulerSettings, default_total_steps: int | None
) -> LambdaLR:
    """LambdaLR applying `lr_multiplier`; call `.step()` once after each optimizer step.

    total_steps = settings.total_steps, else `default_total_steps` (the worker's estimate of its optimizer
    steps over the run). Linear and cosine need one and it must cover the warmup.
    """
    total_steps = settings.total_steps if settings.total_steps is not None else default_total_steps
    if settings.name != "constant":
        if total_steps is None:
            raise ValueError(f"scheduler.total_steps is required for scheduler.name={settings.name!r}")
        if total_steps < settings.warmup_steps:
            raise ValueError(
                f"scheduler.total_steps={total_steps} is shorter than scheduler.warmup_steps={settings.warmup_steps}"
            )

    # A closure (not a callable object) keeps LambdaLR.state_dict free of the function, so the saved state is
    # plain numbers that torch.load(weights_only=True) accepts.
    def multiplier(step: int) -> float:
        return lr_multiplier(step, settings, total_steps)

    return LambdaLR(optimizer, multiplier)
