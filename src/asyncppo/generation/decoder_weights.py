"""The graph engine's view of a Hugging Face decoder: its shape, and engine-owned copies of its weights.

`GraphGenerator` builds a `DecoderWeights` from the policy model and calls `refresh` after every weight
change. The copies live at fixed addresses (CUDA graphs captured over them stay valid) and fuse q/k/v and
gate/up into one matrix each, so a decode step runs two GEMMs fewer per layer than the HF modules would.

Families: Llama, Qwen2 / Qwen2.5, Qwen3 and Mistral (pre-norm, RMSNorm, rotary, GQA, SiLU-gated MLP). Any
other architecture, or a feature of these that the engine does not implement, is refused with one line
that names `generation.backend: hf`, which runs every causal LM.
"""

from dataclasses import dataclass

import torch
from torch import nn
from transformers import PretrainedConfig, PreTrainedModel

SUPPORTED_MODEL_TYPES = ("llama", "qwen2", "qwen3", "mistral")
# Rotary variants whose inverse frequencies do not depend on the sequence length, so one table serves all.
STATIC_ROPE_TYPES = ("default", "linear", "llama3", "yarn")


class UnsupportedModelError(ValueError):
    """The model cannot run on the graph engine; the message says why and names the `hf` backend."""


def _refuse(config: PretrainedConfig, why: str) -> UnsupportedModelError:
    return UnsupportedModelError(
        f"generation.backend=graph cannot run this {config.model_type!r} model: {why}; "
        "use generation.backend: hf, which runs any causal LM"
    )


@dataclass(frozen=True)
class DecoderShape:
    """Dimensions of the decoder (letters used by the engine: L layers, Hq query heads, Hk KV heads, D head dim)."""

    num_layers: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    rms_norm_eps: float
    qkv_bias: bool
    qk_norm: bool
    """Qwen3 normalises each query and key head (RMSNorm over D) before the rotary embedding."""
    tied_embeddings: bool

    @property
    def q_size(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_kv_heads * self.head_dim

    def kv_bytes_per_token(self, dtype_bytes: int) -> int:
        """Bytes of K and V that one cached token holds over all layers."""
        return 2 * self.num_layers * self.kv_size * dtype_bytes


def decoder_shape(model: PreTrainedModel) -> DecoderShape:
    """The shape of `model`, or UnsupportedModelError naming what the engine does not implement."""
    config = model.config
    if config.model_type not in SUPPORTED_MODEL_TYPES:
        raise _refuse(config, f"supported families are {', '.join(SUPPORTED_MODEL_TYPES)}")
    if getattr(config, "hidden_act", "silu") != "silu":
        raise _refuse(config, f"hidden_act={config.hidden_act!r} (only silu is implemented)")
    if getattr(config, "mlp_bias", False):
        raise _refuse(config, "mlp_bias=True")
    layer_types = getattr(config, "layer_types", None) or []
    if any(kind != "full_attention" for kind in layer_types) or getattr(config, "use_sliding_window", False):
        raise _refuse(config, "sliding-window attention layers")
    if config.model_type == "mistral" and getattr(config, "sliding_window", None) is not None:
        # Mistral applies its window whenever it is set; the engine attends to the whole context.
        raise _refuse(config, f"sliding_window={config.sliding_window} (set it to null if the model never uses it)")
    rope = getattr(config, "rope_parameters", None) or getattr(config, "rope_scaling", None) or {}
    rope_type = rope.get("rope_type", rope.get("type", "default"))
    if rope_type not in STATIC_ROPE_TYPES:
        raise _refuse(config, f"rope_type={rope_type!r} (implemented: {', '.join(STATIC_ROPE_TYPES)})")
    num_heads = config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // num_heads
    names = dict(model.named_parameters(remove_duplicate=False))
    embed, head = names["model.embed_tokens.weight"], names.get("lm_head.weight")
    return DecoderShape(
        num_layers=config.num_hidden_layers,
        hidden_size=config.hidden_size,
        num_heads=num_heads,
        num_kv_heads=getattr(config, "num_key_value_heads", None) or num_heads,
        head_dim=head_dim,
        intermediate_size=config.intermediate_size,
        vocab_size=int(embed.shape[0]),
        rms_norm_eps=float(config.rms_norm_eps),
        qkv_bias="model.layers.0.self_attn.q_proj.bias" in names,
        qk_norm="model.layers.0.self_attn.q_norm.weight" in names,
        tied_embeddings=head is None or head is embed,
    )


@dataclass(frozen=True)
class LayerWeights:
    """One decoder layer's tensors, engine-owned (shapes: qkv [Hq*D + 2*Hk*D, hidden], gate_up [2*I, hidden])."""

    input_norm: torch.Tensor
    qkv: torch.Tensor
    qkv_bias: torch.Tensor | None
    q_norm: torch.Tensor | None
    k_norm: torch.Tensor | None
    out: torch.Tensor
    post_norm: torch.Tensor
    gate_up: torch.Tensor
    down: torch.Tensor


def _copy_rows(destination: torch.Tensor, parts: list[torch.Tensor]) -> None:
    start = 0
    for part in parts:
        destination[start : start + part.shape[0]].copy_(part)
        start += part.shape[0]


class DecoderWeights:
    """Engine-owned weight copies at fixed addresses; `refresh(model)` copies the model's current values in.

    Keeping our own copies (rather than views of the trainer's parameters) costs one device copy per weight
    change (about 1 GB for a 0.5B model, well under a millisecond on an H200) and buys fused q/k/v and
    gate/up matrices and immunity to a trainer that re-allocates its parameters. Parameters are found by
    their Hugging Face names (`model.layers.{i}.self_attn.q_proj.weight`, ...), the same in every family here.
    """

    def __init__(self, model: PreTrainedModel, shape: DecoderShape, dtype: torch.dtype):
        self.shape = shape
        self.dtype = dtype
        names = dict(model.named_parameters(remove_duplicate=False))
        device = names["model.embed_tokens.weight"].device

        def owned(name: str) -> torch.Tensor:
            return torch.empty(names[name].shape, dtype=dtype, device=device)

        def fused(rows: int, columns: int | None = None) -> torch.Tensor:
            size = (rows,) if columns is None else (rows, columns)
            return torch.empty(size, dtype=dtype, device=device)

        self.embed = owned("model.embed_tokens.weight")
        self.lm_head = self.embed if shape.tied_embeddings else owned("lm_head.weight")
        self.final_norm = owned("model.norm.weight")
        hidden, qkv_rows = shape.hidden_size, shape.q_size + 2 * shape.kv_size
        self.layers: list[LayerWeights] = []
        for index in range(shape.num_layers):
            prefix = f"model.layers.{index}."
            self.layers.append(
                LayerWeights(
                    input_norm=owned(prefix + "input_layernorm.weight"),
                    qkv=fused(qkv_rows, hidden),
                    qkv_bias=fused(qkv_rows) if shape.qkv_bias else None,
                    q_norm=owned(prefix + "self_attn.q_norm.weight") if shape.qk_norm else None,
                    k_norm=owned(prefix + "self_attn.k_norm.weight") if shape.qk_norm else None,
                    out=owned(prefix + "self_attn.o_proj.weight"),
                    post_norm=owned(prefix + "post_attention_layernorm.weight"),
                    gate_up=fused(2 * shape.intermediate_size, hidden),
                    down=owned(prefix + "mlp.down_proj.weight"),
                )
            )
        self.refresh(model)

    @torch.no_grad()
    def refresh(self, model: PreTrainedModel) -> None:
        """Copy every weight of `model` (same architecture, any dtype) into the engine's tensors, in place."""
        names = dict(model.named_parameters(remove_duplicate=False))
        self.embed.copy_(names["model.embed_tokens.weight"])
        if not self.shape.tied_embeddings:
            self.lm_head.copy_(names["lm_head.weight"])
        self.final_norm.copy_(names["model.norm.weight"])
        for index, owned in enumerate(self.layers):
            prefix = f"model.layers.{index}."
            attention, mlp = prefix + "self_attn.", prefix + "mlp."
            owned.input_norm.copy_(names[prefix + "input_layernorm.weight"])
            _copy_rows(owned.qkv, [names[attention + f"{p}_proj.weight"] for p in "qkv"])
            if owned.qkv_bias is not None:
                _copy_rows(owned.qkv_bias, [names[attention + f"{p}_proj.bias"] for p in "qkv"])
            if owned.q_norm is not None and owned.k_norm is not None:
                owned.q_norm.copy_(names[attention + "q_norm.weight"])
                owned.k_norm.copy_(names[attention + "k_norm.weight"])
            owned.out.copy_(names[attention + "o_proj.weight"])
            owned.post_norm.copy_(names[prefix + "post_attention_layernorm.weight"])
            _copy_rows(owned.gate_up, [names[mlp + "gate_proj.weight"], names[mlp + "up_proj.weight"]])
            owned.down.copy_(names[mlp + "down_proj.weight"])

    def num_bytes(self) -> int:
        """Bytes one decode step reads from the weights (the lm head once, even when tied)."""
        tensors: list[torch.Tensor] = [self.lm_head, self.final_norm]
        for layer in self.layers:
            tensors += [t for t in vars(layer).values() if isinstance(t, torch.Tensor)]
        return sum(t.numel() * t.element_size() for t in tensors)


def rotary_inverse_frequencies(model: PreTrainedModel) -> tuple[torch.Tensor, float]:
    """The model's own rotary inverse frequencies [D/2] (fp32, scaling already applied) and attention scaling.

    Read from the HF rotary module rather than recomputed, so every static rope variant matches exactly.
    """
    rotary = getattr(getattr(model, "model", None), "rotary_emb", None)
    inverse_frequencies = getattr(rotary, "inv_freq", None)
    if not isinstance(rotary, nn.Module) or not isinstance(inverse_frequencies, torch.Tensor):
        raise _refuse(model.config, "no rotary_emb.inv_freq on the backbone")
    return inverse_frequencies.float(), float(getattr(rotary, "attention_scaling", 1.0))
