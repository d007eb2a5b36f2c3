"""Checks shared by every generation engine: is a request servable, and is a weight update complete.

The hf and graph cores (`HFCore`, `GraphCore`) call these before a request is queued or weights are copied in,
so both engines refuse the same inputs with the same messages.
"""

from collections.abc import Sequence

import torch
from torch import nn

from asyncppo.generation.protocol import GenerationRequest


def request_problem(request: GenerationRequest, max_context_length: int, vocab_size: int) -> str | None:
    """Why `request` cannot run (empty prompt, no room left to generate, ids outside the vocabulary), or None."""
    prompt = request.prompt_token_ids
    if not prompt:
        return "the prompt is empty: a request needs at least one prompt token"
    if len(prompt) >= max_context_length:
        return (
            f"the prompt has {len(prompt)} tokens, which leaves no room to generate under "
            f"max_context_length={max_context_length}"
        )
    if bad := [token for token in prompt if not 0 <= token < vocab_size]:
        return f"prompt token ids {bad[:5]} are outside the vocabulary [0, {vocab_size})"
    return None


def check_named_tensors(model: nn.Module, named_tensors: Sequence[tuple[str, torch.Tensor]]) -> None:
    """ValueError unless `named_tensors` covers every parameter of `model` exactly once, with matching shapes.

    Tied parameters (e.g. lm_head.weight and embed_tokens.weight) may come under either name or both.
    """
    parameters = dict(model.named_parameters(remove_duplicate=False))
    names = [name for name, _ in named_tensors]
    if duplicates := sorted({name for name in names if names.count(name) > 1}):
        raise ValueError(f"load_weights: parameters sent more than once: {duplicates[:5]}")
    if extra := [name for name in names if name not in parameters]:
        raise ValueError(f"load_weights: {extra[:5]} are not parameters of {type(model).__name__}")
    for name, tensor in named_tensors:
        if tuple(tensor.shape) != tuple(parameters[name].shape):
            raise ValueError(
                f"load_weights: {name} has shape {tuple(tensor.shape)}, the model's is {tuple(parameters[name].shape)}"
            )
    covered = {id(parameters[name]) for name in names}
    if missing := [name for name, parameter in model.named_parameters() if id(parameter) not in covered]:
        raise ValueError(f"load_weights: missing parameters {missing[:5]} ({len(missing)} in all)")


def copy_named_tensors(model: nn.Module, named_tensors: Sequence[tuple[str, torch.Tensor]]) -> None:
    """Check `named_tensors` (see check_named_tensors), then copy each into the parameter of that name in place.

    Everything is checked before anything is copied, so a rejected update leaves the old weights in place.
    Values are cast to each parameter's dtype and device.
    """
    check_named_tensors(model, named_tensors)
    parameters = dict(model.named_parameters(remove_duplicate=False))
    with torch.no_grad():
        for name, tensor in named_tensors:
            parameters[name].copy_(tensor)
