"""A model behind one per-token forward (logprobs or values), sharded with FSDP2 in a group, scored without grad.

`TrainedWorker` builds on it for the policy and the critic; the policy worker's frozen reference policy is one
on its own. Letters: B samples, S positions.
"""

import functools
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Protocol

import torch
from torch import nn
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict, set_model_state_dict
from transformers import PreTrainedModel

from asyncppo.models.varlen_attention import use_packed_attention
from asyncppo.types import TrainBatch
from asyncppo.workers.data_parallel import (
    current_data_parallel,
    full_tensor,
    gather_rows,
    max_over_ranks,
    shard_module,
    transformer_layers,
)
from asyncppo.workers.microbatches import TokenTally, shard_rows, trim_padding


class TokenForward(Protocol):
    """(model, input_ids [B, S], attention_mask [B, S], packed=...) -> [B, S] fp32 (`token_logprobs`, `values`)."""

    def __call__(
        self, model: PreTrainedModel, input_ids: torch.Tensor, attention_mask: torch.Tensor, *, packed: bool
    ) -> torch.Tensor: ...


_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
# Attribute names under which Hugging Face attention modules keep a dropout probability as a float.
_DROPOUT_ATTRIBUTES = ("attention_dropout", "dropout", "hidden_dropout", "attn_dropout")


def resolve_dtype(dtype: torch.dtype | str) -> torch.dtype:
    """A torch dtype from itself or its config name (`float32`, `bfloat16`, `float16`)."""
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype not in _DTYPES:
        raise ValueError(f"dtype {dtype!r}: use one of {sorted(_DTYPES)}")
    return _DTYPES[dtype]


def disable_dropout(model: nn.Module) -> None:
    """Set every dropout probability to 0.

    Old logprobs and values are scored in eval mode; training runs in train mode (activation checkpointing
    needs it). With dropout on, the first PPO ratio would not be 1 and the value targets would be noisy.
    """
    for module in model.modules():
        if isinstance(module, nn.Dropout):
            module.p = 0.0
        for name in _DROPOUT_ATTRIBUTES:
            if isinstance(getattr(module, name, None), float):
                setattr(module, name, 0.0)


class ModelForward(nn.Module):
    """`forward(input_ids, attention_mask) = fn(model, ...)`: one entry point, so FSDP2's root hooks gather the
    root-level weights (embeddings, final norm, output head, tied or not) around the whole computation."""

    def __init__(
        self, model: PreTrainedModel, fn: Callable[[PreTrainedModel, torch.Tensor, torch.Tensor], torch.Tensor]
    ):
        super().__init__()
        self.model = model
        self.fn = fn

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        return self.fn(self.model, input_ids, attention_mask)


class ScoringModel:
    """`model` wrapped for one per-token forward; in a data-parallel group its weights are FSDP2 shards.

    packed: every forward runs the rows' real tokens back to back (`models/packing.py`); the model is switched to
    the packed-capable attention once, here. `scored` counts the token positions scoring computed.
    """

    def __init__(
        self,
        model: PreTrainedModel,
        fn: TokenForward,
        *,
        device: torch.device,
        scoring_batch_size: int,
        packed: bool = False,
    ):
        if scoring_batch_size < 1:
            raise ValueError(f"logprob_batch_size must be >= 1, got {scoring_batch_size}")
        self.model = model
        self.device = device
        self.scoring_batch_size = scoring_batch_size
        self.packed = packed
        self.scored = TokenTally()
        self.group = current_data_parallel(device)
        disable_dropout(model)
        if packed:
            use_packed_attention(model)
        self.module = ModelForward(model, functools.partial(fn, packed=packed))
        if self.group is not None:
            shard_module(self.module, transformer_layers(model), self.group)
        self.module.eval()

    @torch.no_grad()
    def score(self, batch: TrainBatch) -> torch.Tensor:
        """[B, S] fp32 on CPU, in eval mode, `scoring_batch_size` rows per forward (each trimmed of padding).

        In a group each rank scores its share of rows and the shares are gathered; ranks run the same number
        of forwards (a rank short of rows repeats row 0 and drops the result).
        """
        num_samples, seq_len = batch.input_ids.shape
        world = 1 if self.group is None else self.group.world_size
        shares = [shard_rows(range(num_samples), rank, world) for rank in range(world)]
        mine = shares[0 if self.group is None else self.group.rank]
        size = self.scoring_batch_size
        chunks = [mine[start : start + size] for start in range(0, len(mine), size)]
        self.module.eval()
        outputs = [torch.zeros(0, seq_len)]
        for index in range(max_over_ranks(len(chunks), self.group)):
            rows = chunks[index] if index < len(chunks) else [0]
            micro = trim_padding(batch.select(rows)).to(self.device)
            self.scored.add(micro.attention_mask, self.packed, stand_in=index >= len(chunks))
            scored = self.module(micro.input_ids, micro.attention_mask).float()
            if index < len(chunks):
                outputs.append(torch.nn.functional.pad(scored, (0, seq_len - scored.shape[1])).cpu())
        return gather_rows(torch.cat(outputs), [len(share) for share in shares], self.group)

    def named_weights(self) -> Iterator[tuple[str, torch.Tensor]]:
        """(name, full tensor) of every parameter and persistent buffer, by `model`'s own names.

        Tied parameters appear once, under their first name (`model.embed_tokens.weight`, not `lm_head.weight`):
        a receiver of the same architecture ties them itself (or loads with strict=False). Unsharded, the tensors
        are views of the live weights (no copy): copy them before the next train step if they must stay. In a
        group this is a collective: every rank must iterate to the end, though only the sender uses the tensors.
        """
        persistent = set(self.model.state_dict().keys())
        for name, parameter in self.model.named_parameters():
            yield name, full_tensor(parameter.detach())
        for name, buffer in self.model.named_buffers():
            if name in persistent:
                yield name, full_tensor(buffer.detach())

    def full_state_dict(self) -> dict[str, Any] | None:
        """The whole state dict on CPU for saving; in a group only rank 0 gets it (others None)."""
        if self.group is None:
            return None  # save_pretrained reads the unsharded model itself
        options = StateDictOptions(full_state_dict=True, cpu_offload=True)
        state = get_model_state_dict(self.model, options=options)
        return state if self.group.rank == 0 else None

    def load_weights(self, read: Callable[[Path], dict[str, Any]], directory: Path) -> None:
        """Copy the weights `read(directory)` returns into the model in place (optimizer references stay valid).

        In a group only rank 0 reads; the tensors reach the other ranks' shards by broadcast.
        """
        if self.group is None:
            self.model.load_state_dict(read(directory))
            return
        state = read(directory) if self.group.rank == 0 else {}
        options = StateDictOptions(full_state_dict=True, broadcast_from_rank0=True)
        set_model_state_dict(self.model, state, options=options)
