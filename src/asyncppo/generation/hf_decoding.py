"""The eager decode loop of the hf backend: one batch of requests through a transformers causal LM.

`HFCore` (`generation/hf_generator.py`) calls `decode_batch` from its front's serving thread; tests call it
directly. Letters: N rows in the batch, P longest prompt, V vocabulary.

    prompts --left pad--> prefill [N, P] --sample--> step [N', 1] --sample--> ... (N' = rows still running)

The loop is ours rather than `model.generate` so the logprob of each token is exactly the one it was sampled
with (generate's scores are post-processed and it applies top_k=50 by default).
"""

import functools
import inspect
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
from transformers import DynamicCache, PreTrainedModel

from asyncppo.generation.protocol import FinishReason, GenerationRequest
from asyncppo.generation.sampling import SamplingSettings, sample_next_tokens


@dataclass
class DecodedSequence:
    """What one request produced."""

    token_ids: list[int] = field(default_factory=list[int])
    logprobs: list[float] = field(default_factory=list[float])
    finish_reason: FinishReason = "length"


def left_pad(
    prompts: Sequence[Sequence[int]], pad_token_id: int, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    """input_ids [N, P] (long) and attention_mask [N, P] (long) with every prompt right-aligned."""
    width = max(len(prompt) for prompt in prompts)
    input_ids = torch.full((len(prompts), width), pad_token_id, dtype=torch.long)
    attention_mask = torch.zeros((len(prompts), width), dtype=torch.long)
    for row, prompt in enumerate(prompts):
        input_ids[row, width - len(prompt) :] = torch.tensor(prompt, dtype=torch.long)
        attention_mask[row, width - len(prompt) :] = 1
    return input_ids.to(device), attention_mask.to(device)


@functools.cache
def cache_keyword(model_class: type[PreTrainedModel]) -> str:
    """The forward() argument that takes the KV cache: `cache` from transformers 5.2x, `past_key_values` before."""
    parameters = inspect.signature(model_class.forward).parameters
    return "cache" if "cache" in parameters else "past_key_values"


def decode_batch(
    model: PreTrainedModel,
    requests: Sequence[GenerationRequest],
    *,
    eos_token_ids: frozenset[int],
    pad_token_id: int,
    max_context_length: int,
    device: torch.device,
    generator: torch.Generator | None,
) -> list[DecodedSequence]:
    """Continue every request until a stop token, its max_new_tokens or max_context_length; one result per request.

    Prefill runs the left-padded batch with position_ids = cumsum(mask) - 1, the positions the trainer's
    recompute (`models.policy.token_logprobs`) uses, so left padding does not change any row's logits. Each
    step feeds one token per running row through the DynamicCache. A row that finishes is dropped from the
    batch (its cache rows too), so it costs nothing afterwards. The caller holds inference_mode and eval mode.
    Every prompt must be non-empty and shorter than max_context_length (the engine checks at submit).
    """
    prompts = [request.prompt_token_ids for request in requests]
    budgets = [min(r.sampling.max_new_tokens, max_context_length - len(r.prompt_token_ids)) for r in requests]
    assert min(len(prompt) for prompt in prompts) >= 1 and min(budgets) >= 1, "the engine validates requests"
    stop_sets = [
        frozenset() if r.sampling.ignore_eos else eos_token_ids | frozenset(r.sampling.stop_token_ids) for r in requests
    ]
    results = [DecodedSequence() for _ in requests]

    settings = SamplingSettings.from_params([r.sampling for r in requests], device)
    cache = DynamicCache(config=model.config)
    cache_argument = {cache_keyword(type(model)): cache}
    running = list(range(len(requests)))  # request index of each batch row
    logits, attention_mask, next_position = _prefill(model, prompts, pad_token_id, device, cache_argument)
    while True:
        tokens, logprobs = sample_next_tokens(logits, settings, generator)
        keep = _record_step(tokens, logprobs, [(results[i], stop_sets[i], budgets[i]) for i in running])
        if not keep:
            return results
        if len(keep) < len(running):
            index = torch.tensor(keep, dtype=torch.long, device=device)
            cache.batch_select_indices(index)
            attention_mask, tokens, next_position = attention_mask[index], tokens[index], next_position[index]
            settings = settings.select(index)
            running = [running[row] for row in keep]
        attention_mask = torch.cat([attention_mask, attention_mask.new_ones(len(running), 1)], dim=1)
        logits = model(
            input_ids=tokens.unsqueeze(-1),
            attention_mask=attention_mask,
            position_ids=next_position.unsqueeze(-1),
            **cache_argument,
            use_cache=True,
        ).logits[:, -1]
        next_position = next_position + 1


def _prefill(
    model: PreTrainedModel,
    prompts: Sequence[Sequence[int]],
    pad_token_id: int,
    device: torch.device,
    cache_argument: dict[str, DynamicCache],
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The left-padded prompts through the model into the cache: last-position logits [N, V], the attention
    mask [N, P] and each row's next position [N] (positions count real tokens only, as the trainer's)."""
    input_ids, attention_mask = left_pad(prompts, pad_token_id, device)
    position_ids = (attention_mask.cumsum(dim=-1) - 1).clamp(min=0)
    logits = model(
        input_ids=input_ids,
        attention_mask=attention_mask,
        position_ids=position_ids,
        **cache_argument,
        use_cache=True,
        logits_to_keep=1,
    ).logits[:, -1]
    return logits, attention_mask, position_ids[:, -1] + 1


def _record_step(
    tokens: torch.Tensor, logprobs: torch.Tensor, rows: Sequence[tuple[DecodedSequence, frozenset[int], int]]
) -> list[int]:
    """Append each batch row's sampled token and logprob to its (result, stop ids, token budget); the batch rows
    that go on (no stop token, budget left). A stop token ends its row with finish_reason "stop"."""
    keep = []
    for row, (token, logprob) in enumerate(zip(tokens.tolist(), logprobs.tolist(), strict=True)):
        result, stop_ids, budget = rows[row]
        result.token_ids.append(token)
        result.logprobs.append(logprob)
        if token in stop_ids:
            result.finish_reason = "stop"
        elif len(result.token_ids) < budget:
            keep.append(row)
    return keep
