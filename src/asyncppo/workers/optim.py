"""AdamW and the learning-rate schedule of the training workers, built from the `optimizer` and
`scheduler` config sections.

The policy and value workers call `build_optimizer` and `build_scheduler` when they start, after a warm start and
after `load(..., load_optimizer=False)`; `load` with the optimizer calls `apply_optimizer_settings` after it restores
the saved states. The schedule is a multiplier of the peak LR, ticked once per optimizer step.
"""

import math
from collections.abc import Iterable

import torch
from torch import nn
from torch.optim.lr_scheduler import LambdaLR

from asyncppo.config.models import OptimizerConfig, SchedulerConfig


def build_optimizer(parameters: Iterable[nn.Parameter], settings: OptimizerConfig) -> torch.optim.AdamW:
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


def lr_multiplier(step: int, settings: SchedulerConfig, total_steps: int | None) -> float:
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
    optimizer: torch.optim.Optimizer, settings: SchedulerConfig, default_total_steps: int | None
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


def apply_optimizer_settings(optimizer: torch.optim.Optimizer, scheduler: LambdaLR, settings: OptimizerConfig) -> None:
    """After a checkpoint's optimizer and scheduler states are loaded: the config's peak LR, weight decay, betas
    and eps win (a resumed run may change them), while Adam's moments and the schedule position stay the
    checkpoint's. The LR is recomputed as LambdaLR computes it, so an unchanged config resumes bit for bit.
    """
    scheduler.base_lrs = [settings.lr] * len(optimizer.param_groups)
    for group, multiplier in zip(optimizer.param_groups, scheduler.lr_lambdas, strict=True):
        group.update(
            initial_lr=settings.lr,
            weight_decay=settings.weight_decay,
            betas=tuple(settings.betas),
            eps=settings.eps,
            lr=settings.lr * multiplier(scheduler.last_epoch),
        )
