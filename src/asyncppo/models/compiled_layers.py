"""Decoder layers compiled with torch.compile for the trainer's forwards, so their element-wise work runs fused.

`compile_decoder_layers(model)` is called once per trained model by the workers (`workers/trained_model.py`, and
the policy worker for its frozen reference), before any sharding. Between a layer's matmuls sit its RMSNorms,
rotary embeddings, SiLU-and-multiply, residual adds and dtype casts: run eagerly, each is a kernel of its own
that reads and writes the whole activation, and at the 0.5B shape those kernels took more GPU time than the
matmuls. Compiled, inductor fuses them into a few kernels per layer.

    layer.forward(hidden, ..., use_cache=False)   # training and scoring (models/backbone.py)
        -> torch.compile(type(layer).forward)     # one compiled function per layer class, shared by all layers
    layer.forward(hidden, ..., use_cache=True)    # the `hf` engine decoding from the same model
        -> type(layer).forward, eager             # a KV cache changes every call: nothing to reuse

- One graph serves every layer of a class: compile lifts the weights to graph inputs, so the layers (and the
  policy's, critic's and reference's, when they share a shape) differ only in their inputs.
- Shapes are dynamic from the first call (`dynamic=True`): packed micro-batches differ in token count and in
  their longest sequence, padded ones in rows and columns; a graph specialised to the first shape would be
  compiled again at the second. Training (with grad) and scoring (without) are two graphs.
- The packed attention stays our FlashAttention varlen kernel, a custom op compile leaves opaque
  (`varlen_attention.py`); the padded path's SDPA kernel is picked while tracing under the trainer's
  `sdpa_kernel` priority list (`backbone.last_hidden_states`), never cuDNN. The output head is outside the
  layers and stays the fused chunked head (`output_head.py`).
"""

import functools
from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from transformers import PreTrainedModel

# Keyword arguments through which transformers versions hand a decoder layer its KV cache.
_CACHE_ARGUMENTS = ("cache", "past_key_values", "past_key_value")


def decoder_layers(model: PreTrainedModel) -> list[nn.Module]:
    """The repeated blocks of `model` (the classes its `_no_split_modules` names, e.g. Qwen2DecoderLayer)."""
    names = set(getattr(model, "_no_split_modules", None) or [])
    layers = [module for module in model.modules() if type(module).__name__ in names]
    if not layers:
        raise ValueError(f"{type(model).__name__} declares no _no_split_modules; cannot find its decoder layers")
    return layers


@functools.cache
def _compiled(forward: Callable[..., Any], backend: str) -> Callable[..., Any]:
    """`forward` (a layer class's unbound forward) under torch.compile, made once per class and backend."""
    return torch.compile(forward, backend=backend, dynamic=True)


def _uses_kv_cache(kwargs: dict[str, Any]) -> bool:
    return bool(kwargs.get("use_cache")) or any(kwargs.get(name) is not None for name in _CACHE_ARGUMENTS)


def _without_checkpointing(forward: Callable[..., Any]) -> tuple[Callable[..., Any], bool]:
    """(the plain forward, whether a checkpointing wrapper was removed from it).

    Newer transformers put activation checkpointing in a wrapper around each layer class's forward (older ones in
    the layer's __call__, outside the forward). Traced inside a compiled graph, that wrapper's checkpoint region
    broke the graph, and the layer ran eagerly; so the plain forward is compiled and the checkpoint goes around
    the compiled call. The wrapper keeps the plain forward as `__wrapped__` (functools.wraps, which renames the
    wrapper but not its code).
    """
    unwrapped = False
    while getattr(getattr(forward, "__code__", None), "co_name", None) == "forward_with_checkpointing":
        forward = forward.__wrapped__  # pyright: ignore[reportFunctionMemberAccess]
        unwrapped = True
    return forward, unwrapped


class CompiledLayerForward:
    """A decoder layer's `forward`: the class's forward compiled when no KV cache is passed, eager otherwise.

    The class's forward is looked up at each call, so a sharded subclass (FSDP2) and the layer's checkpointing
    switch stay in force; and the layer is held, not a bound method, so a deep copy of the model gets a forward
    bound to the copy.
    """

    def __init__(self, layer: nn.Module, backend: str) -> None:
        self.layer = layer
        self.backend = backend

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        layer = self.layer
        forward = type(layer).forward
        if _uses_kv_cache(kwargs):
            return forward(layer, *args, **kwargs)
        plain, had_checkpointing = _without_checkpointing(forward)
        compiled = _compiled(plain, self.backend)
        if had_checkpointing and layer.gradient_checkpointing and layer.training and torch.is_grad_enabled():
            # The function transformers' wrapper would call: torch.utils.checkpoint with the model's settings.
            checkpoint: Callable[..., Any] = layer.__dict__["_gradient_checkpointing_func"]
            return checkpoint(functools.partial(compiled, layer, **kwargs), *args)
        return compiled(layer, *args, **kwargs)


def compile_decoder_layers(model: PreTrainedModel, backend: str = "inductor") -> int:
    """Route every decoder layer of `model` through `CompiledLayerForward` (compiled with `backend`: "inductor" on
    GPUs; tests pass "aot_eager", which traces the same graphs without generating code). Returns the number of
    layers. Compilation itself happens at each graph's first call. Calling it again changes nothing."""
    layers = decoder_layers(model)
    for layer in layers:
        if not isinstance(layer.__dict__.get("forward"), CompiledLayerForward):
            layer.forward = CompiledLayerForward(layer, backend)
    return len(layers)


def compiled_layer_count(model: nn.Module) -> int:
    """How many modules of `model` run a `CompiledLayerForward` (0 when eager)."""
    return sum(isinstance(module.__dict__.get("forward"), CompiledLayerForward) for module in model.modules())
