"""The transformer trunk of a Hugging Face model, run once per batch to get per-position hidden states.

Shared by `policy.token_logprobs` (output head applied in chunks) and `value.values` (scalar head applied
per position), in the padded layout ([B, S]) or the packed one (`models/packing.py`). The backbone's decoder
layers may be compiled (`models/compiled_layers.py`, applied by the workers): these forwards pass no KV cache, so
they run the compiled layers. Letters: B batch, S sequence, H hidden size, T packed tokens.
"""

import torch
from torch import nn
from torch.nn.attention import SDPBackend, sdpa_kernel
from transformers import PreTrainedModel

from asyncppo.models.packing import PackedRows
from asyncppo.models.varlen_attention import PACKED_ATTENTION

TRAINING_ATTENTION_BACKENDS = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]
"""Attention kernels the trainer's forward and backward may use, in priority order (never cuDNN)."""


def get_backbone(model: PreTrainedModel) -> nn.Module:
    """The trunk under a task head (`model.model` for Llama): `base_model_prefix` names it in every HF class."""
    backbone = getattr(model, model.base_model_prefix, None)
    if not isinstance(backbone, nn.Module):
        raise ValueError(
            f"{type(model).__name__} has no backbone attribute {model.base_model_prefix!r} (its base_model_prefix)"
        )
    return backbone


def position_ids_from_mask(attention_mask: torch.Tensor) -> torch.Tensor:
    """[B, S] positions counted over real tokens only: cumsum(mask) - 1, clamped at 0 on leading padding.

    This is what `generate` uses for left-padded prompts, so a recompute of a left-padded batch sees the
    same rotary positions the generator saw; for right padding it equals 0..S-1 on every real token.
    """
    return (attention_mask.long().cumsum(dim=-1) - 1).clamp(min=0)


def last_hidden_states(model: PreTrainedModel, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """[B, S, H] final hidden states (after the final norm) of `model`'s backbone, in the model's dtype."""
    if input_ids.shape != attention_mask.shape or input_ids.dim() != 2:
        raise ValueError(
            f"input_ids {tuple(input_ids.shape)} and attention_mask {tuple(attention_mask.shape)} must both be [B, S]"
        )
    # The attention kernels are chosen here, not by SDPA: on Hopper it would pick cuDNN attention, which builds a
    # new graph (~40 ms) for every new batch shape, so every new training or scoring shape would stall. Flash
    # runs unmasked (causal) batches, the memory-efficient kernel padded ones, math only where neither applies.
    # Compiled decoder layers (`models/compiled_layers.py`) pick their kernel once, while tracing, under this list.
    with sdpa_kernel(TRAINING_ATTENTION_BACKENDS, set_priority=True):
        outputs = get_backbone(model)(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids_from_mask(attention_mask),
            use_cache=False,
        )
    return outputs.last_hidden_state


# A prepared 4-D mask is passed through by transformers' mask builders untouched; the packed attention ignores it.
# Passing one keeps transformers from building a [T, T] block mask out of the restarting position ids.
_NO_MASK = torch.zeros(1, 1, 0, 0, dtype=torch.bool)


def packed_hidden_states(model: PreTrainedModel, input_ids: torch.Tensor, packed: PackedRows) -> torch.Tensor:
    """[T, H] final hidden states of the packed real tokens of `input_ids` [B, S] (see `models/packing.py`).

    Needs the model switched by `varlen_attention.use_packed_attention`: each sequence attends only to itself.
    """
    if model.config._attn_implementation != PACKED_ATTENTION:
        raise ValueError(
            f"packed forward on a model using {model.config._attn_implementation!r} attention; "
            "call varlen_attention.use_packed_attention(model) first"
        )
    outputs = get_backbone(model)(
        input_ids=packed.gather(input_ids).unsqueeze(0),
        attention_mask=_NO_MASK.to(input_ids.device),
        position_ids=packed.position_ids.unsqueeze(0),
        use_cache=False,
        cu_seq_lens_q=packed.cu_seq_lens,
        cu_seq_lens_k=packed.cu_seq_lens,
        max_length_q=packed.max_length,
        max_length_k=packed.max_length,
    )
    return outputs.last_hidden_state.squeeze(0)
