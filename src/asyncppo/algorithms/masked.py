"""Masked reductions shared by the estimators, losses and diagnostics.

Shapes: any tensor `x` and a mask of the same shape (1 = counts, 0 = ignored; float or bool).
"""

import torch


def masked_sum(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """sum(x * mask) over every element."""
    return (x * mask).sum()


def masked_mean(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """sum(x * mask) / sum(mask); the caller guarantees sum(mask) > 0."""
    return masked_sum(x, mask) / mask.sum()


def masked_var(x: torch.Tensor, mask: torch.Tensor, unbiased: bool = True) -> torch.Tensor:
    """Masked variance: sum(mask * (x - mean)^2) / (n - 1) when unbiased, else / n, with n = sum(mask)."""
    mean = masked_mean(x, mask)
    n = mask.sum()
    squared = masked_sum((x - mean) ** 2, mask)
    return squared / (n - 1) if unbiased else squared / n


def whiten(x: torch.Tensor, mask: torch.Tensor, eps: float = 1e-8) -> torch.Tensor:
    """(x - mean) / sqrt(var + eps) with masked mean and unbiased masked variance; 0 where mask == 0.

    The mean is not restored (advantages become zero-mean), matching NeMo-RL.
    """
    mean = masked_mean(x, mask)
    var = masked_var(x, mask, unbiased=True)
    return ((x - mean) * torch.rsqrt(var + eps)) * mask
