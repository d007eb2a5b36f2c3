"""The policy: loading a local Hugging Face causal LM and per-token log-probabilities under a temperature.

Called by the policy workers (old/new logprobs for the PPO ratio), the reference policy (KL) and the hf
generation backend's checks. Letters: B batch, S sequence, V vocabulary, H hidden size.
"""

from pathlib import Path

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint
from transformers import AutoModelForCausalLM, PretrainedConfig, PreTrainedModel

from asyncppo.models.backbone import last_hidden_states
from asyncppo.models.model_directory import require_model_directory

# Config fields of output-head transforms that token_logprobs does not reproduce, with the value at which
# each is a no-op. Computing logprobs without them would disagree with the model's own forward.
_SOFT_CAP_OFF = (None, 0, 0.0)
_SCALE_OFF = (None, 1, 1.0)
_UNSUPPORTED_LOGIT_TRANSFORMS: dict[str, tuple[float | None, ...]] = {
    "final_logit_softcapping": _SOFT_CAP_OFF,  # gemma2/3/4: cap * tanh(logits / cap)
    "output_logit_soft_cap": _SOFT_CAP_OFF,
    "logit_scale": _SCALE_OFF,  # cohere: logits * logit_scale
    "logits_scaling": _SCALE_OFF,  # granite: logits / logits_scaling
}


def load_policy(
    path: str | Path, dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu"
) -> PreTrainedModel:
    """Any causal LM saved with `save_pretrained` in the local directory `path`, in `dtype` on `device`.

    Returned in eval mode (as `from_pretrained` leaves it); the trainer switches it with `.train()`.
    """
    directory = require_model_directory(path)
    model: PreTrainedModel = AutoModelForCausalLM.from_pretrained(directory, dtype=dtype, local_files_only=True)
    # functools.wraps on PreTrainedModel.to hides the bound self from pyright.
    return model.to(device)  # pyright: ignore[reportArgumentType]


def _reject_unsupported_logit_transforms(config: PretrainedConfig) -> None:
    # Multimodal configs keep the language model's fields in a nested text config.
    for candidate in (config, config.get_text_config()):
        for name, no_op_values in _UNSUPPORTED_LOGIT_TRANSFORMS.items():
            value = getattr(candidate, name, None)
            if value not in no_op_values:
                raise NotImplementedError(
                    f"config.{name}={value} transforms the logits after the output head; token_logprobs does not "
                    "apply it, so its logprobs would not match the model's own"
                )


def _chunk_token_logprobs(
    head: nn.Module, hidden: torch.Tensor, targets: torch.Tensor, temperature: float
) -> torch.Tensor:
    """[C] log softmax(head(hidden) / temperature)[target] in fp32 for C positions; peak memory C x V fp32."""
    logits = head(hidden).float() / temperature
    # logit[target] - logsumexp(logits) equals log_softmax(...)[target] but keeps no C x V output for backward.
    return logits.gather(-1, targets.unsqueeze(-1)).squeeze(-1) - torch.logsumexp(logits, dim=-1)


def token_logprobs(
    model: PreTrainedModel,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    temperature: float,
    chunk_size: int = 1024,
) -> torch.Tensor:
    """[B, S] fp32 log-probability of each token given the tokens before it.

    out[b, t] = log softmax(logits[b, t-1] / temperature)[input_ids[b, t]] for t >= 1, and out[b, 0] = 0
    (the first token has no prediction). Positions where attention_mask is 0 also hold 0.

    Temperature: the generator samples from softmax(logits / temperature), so the importance ratio
    pi_new / pi_old only compares like with like when both logprobs divide by the same temperature.

    Inputs: input_ids [B, S] long, attention_mask [B, S] (1 = real token; left or right padding).

    Memory: the backbone runs once to get hidden states [B, S, H]; the output head, the division by
    temperature, the fp32 log-softmax and the gather then run over `chunk_size` of the B * (S - 1)
    predicting positions at a time, so the full [B, S, V] fp32 logits never exist. With autograd on, each
    chunk is checkpointed: backward recomputes one chunk's logits at a time instead of keeping them all.
    The head runs in the model's dtype and its output is cast to fp32, as the hf generator does.
    """
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
    if input_ids.dim() != 2 or input_ids.shape[1] == 0:
        raise ValueError(f"input_ids must be [B, S] with S >= 1, got {tuple(input_ids.shape)}")
    _reject_unsupported_logit_transforms(model.config)
    head = model.get_output_embeddings()
    if not isinstance(head, nn.Module):
        raise ValueError(f"{type(model).__name__} has no output embeddings (get_output_embeddings() is None)")

    batch_size, seq_len = input_ids.shape
    hidden = last_hidden_states(model, input_ids, attention_mask)
    predicting = hidden[:, :-1].reshape(-1, hidden.shape[-1])  # [B * (S-1), H]: position t-1 predicts token t
    targets = input_ids[:, 1:].reshape(-1)
    chunks = []
    for start in range(0, predicting.shape[0], chunk_size):
        args = (head, predicting[start : start + chunk_size], targets[start : start + chunk_size], temperature)
        if torch.is_grad_enabled():
            chunks.append(checkpoint(_chunk_token_logprobs, *args, use_reentrant=False))
        else:
            chunks.append(_chunk_token_logprobs(*args))
    shifted = torch.cat(chunks) if chunks else hidden.new_zeros(0, dtype=torch.float32)
    logprobs = torch.nn.functional.pad(shifted.view(batch_size, seq_len - 1), (1, 0))
    return torch.where(attention_mask.bool(), logprobs, torch.zeros_like(logprobs))
