"""Data parallelism of a training group: FSDP2 sharding and the few collectives the training loop needs.

Used by `trained_model.TrainedWorker` and `training.train_pass` when `torch.distributed` is initialised with more
than one rank (a policy or value group spanning several devices; the Ray shells set it up). With one process
every helper is a no-op, so the same code runs in-process and in a group.
"""

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TypeVar

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import FSDPModule, fully_shard
from torch.distributed.tensor import DTensor
from transformers import PreTrainedModel

T = TypeVar("T")


@dataclass(frozen=True)
class DataParallel:
    """This process's place in the group; `device` is where collective tensors live (CUDA for NCCL)."""

    rank: int
    world_size: int
    device: torch.device


def current_data_parallel(device: torch.device) -> DataParallel | None:
    """The group of the default process group when it has more than one rank, else None."""
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return None
    return DataParallel(rank=dist.get_rank(), world_size=dist.get_world_size(), device=device)


def transformer_layers(model: PreTrainedModel) -> list[nn.Module]:
    """The repeated blocks (`_no_split_modules`, e.g. LlamaDecoderLayer): one FSDP unit each."""
    names = set(getattr(model, "_no_split_modules", None) or [])
    layers = [module for module in model.modules() if type(module).__name__ in names]
    if not layers:
        raise ValueError(f"{type(model).__name__} declares no _no_split_modules; cannot pick FSDP units")
    return layers


def shard_module(root: nn.Module, layers: Sequence[nn.Module], group: DataParallel) -> None:
    """FSDP2 in place: each layer its own unit, the rest (embeddings, norm, heads; tied weights together) in root.

    Gradients are reduced by SUM, not the default mean: every loss is already divided by a count over the
    whole global batch (all ranks), so the sum of the ranks' gradients is the global-batch gradient.
    """
    mesh = init_device_mesh(group.device.type, (group.world_size,))
    for layer in layers:
        fully_shard(layer, mesh=mesh)
    fully_shard(root, mesh=mesh)
    for module in root.modules():
        if isinstance(module, FSDPModule):
            module.set_gradient_divide_factor(1.0)
            # A plain SUM collective: the default for factor 1 is PREMUL_SUM, which gloo (CPU groups) lacks.
            module.set_force_sum_reduction_for_comms(True)


def full_tensor(tensor: torch.Tensor) -> torch.Tensor:
    """The whole tensor of a (possibly sharded) parameter; a collective for DTensors, so every rank must call."""
    return tensor.full_tensor() if isinstance(tensor, DTensor) else tensor


def max_over_ranks(value: int, group: DataParallel | None) -> int:
    """The largest `value` of any rank."""
    if group is None:
        return value
    tensor = torch.tensor([value], dtype=torch.long, device=group.device)
    dist.all_reduce(tensor, op=dist.ReduceOp.MAX)
    return int(tensor.item())


def sum_over_ranks(values: Sequence[int], group: DataParallel | None) -> list[int]:
    """Element-wise sum of `values` over the ranks (every rank passes the same number of values)."""
    if group is None:
        return list(values)
    tensor = torch.tensor(list(values), dtype=torch.long, device=group.device)
    dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
    return [int(value) for value in tensor.tolist()]


def sum_tensor_over_ranks(tensor: torch.Tensor, group: DataParallel | None) -> torch.Tensor:
    """The element-wise sum of `tensor` over the ranks (in place on the device; every rank gets it)."""
    if group is not None:
        dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
    return tensor


def all_ranks_finite(value: torch.Tensor, group: DataParallel | None) -> bool:
    """True when `value` (a 0-dim tensor) is finite on every rank."""
    finite = torch.isfinite(value.detach()).to(torch.long).reshape(1)
    if group is not None:
        finite = finite.to(group.device)
        dist.all_reduce(finite, op=dist.ReduceOp.MIN)
    return bool(finite.item())


def gather_objects(item: T, group: DataParallel | None) -> list[T]:
    """Every rank's `item`, in rank order (small picklable values only: metric dicts)."""
    if group is None:
        return [item]
    gathered: list[T | None] = [None] * group.world_size
    dist.all_gather_object(gathered, item)
    return [value for value in gathered if value is not None]


def broadcast_from_rank0(item: T, group: DataParallel | None) -> T:
    """Rank 0's `item` on every rank (small picklable values only)."""
    if group is None:
        return item
    holder: list[T | None] = [item if group.rank == 0 else None]
    dist.broadcast_object_list(holder, src=0)
    assert holder[0] is not None
    return holder[0]


def gather_rows(local: torch.Tensor, counts: Sequence[int], group: DataParallel | None) -> torch.Tensor:
    """Concatenate each rank's [counts[r], ...] rows in rank order, on CPU.

    all_gather needs equal shapes, so every rank pads to the largest count first.
    """
    if group is None:
        return local.cpu()
    largest = max(counts)
    padded = local.new_zeros((largest, *local.shape[1:]))
    padded[: local.shape[0]] = local
    padded = padded.to(group.device)
    pieces = [torch.empty_like(padded) for _ in range(group.world_size)]
    dist.all_gather(pieces, padded)
    return torch.cat([piece[:count].cpu() for piece, count in zip(pieces, counts, strict=True)])
