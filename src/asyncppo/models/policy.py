"""The policy: loading a local Hugging Face causal LM and per-token log-probabilities under a temperature.

Called by the policy workers (old/new logprobs for the PPO ratio), the reference policy (KL) and the hf
generation backend's checks. Letters: B batch, S sequence, V vocabulary, H hidden size.
"""

from pathlib import Path

import torch
from torch import nn
from transformers import AutoModelForCausalLM, PretrainedConfig, PreTrainedModel

from asyncppo.models.backbone import last_hidden_states, packed_hidden_states
from asyncppo.models.model_directory import require_model_directory
from asyncppo.models.output_head import head_token_logprobs
from asyncppo.models.packing import pack_rows

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


def _head_logprobs(
    head: nn.Module, hidden: torch.Tensor, targets: torch.Tensor, temperature: float, chunk_size: int
) -> torch.Tensor:
    """[N] fp32 log softmax(head(hidden) / temperature)[targets] over N positions (`output_head`, chunked)."""
    weight = getattr(head, "weight", None)
    if not isinstance(head, nn.Linear) or not isinstance(weight, torch.Tensor):
        raise ValueError(f"the output head is a {type(head).__name__}; token_logprobs needs a linear head")
    return head_token_logprobs(hidden, weight, head.bias, targets, temperature, chunk_size)


def token_logprobs(
    model: PreTrainedModel,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    temperature: float,
    chunk_size: int = 1024,
    packed: bool = False,
) -> torch.Tensor:
    """[B, S] fp32 log-probability of each token given the tokens before it.

    out[b, t] = log softmax(logits[b, t-1] / temperature)[input_ids[b, t]] for t >= 1, and out[b, 0] = 0
    (the first token has no prediction). Positions where attention_mask is 0 also hold 0.

    Temperature: the generator samples from softmax(logits / temperature), so the importance ratio
    pi_new / pi_old only compares like with like when both logprobs divide by the same temperature.

    Inputs: input_ids [B, S] long, attention_mask [B, S] (1 = real token; left or right padding).

    packed: run the backbone over the real tokens only, back to back (`models/packing.py`; the model must use
    `varlen_attention.use_packed_attention`); the output is the same [B, S] layout. For right-padded rows (the
    trainer's) both layouts compute the same numbers up to float rounding.

    Memory: the backbone runs once to get hidden states; the output head, the division by temperature, the fp32
    log-softmax and the gather then run over `chunk_size` predicting positions at a time, so the full [B, S, V]
    fp32 logits never exist (`models/output_head.py`: its backward recomputes one chunk's logits at a time and
    forms their gradient in place). The head runs in the model's dtype and its output is cast to fp32, as the hf
    generator does.
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

    if packed:
        rows = pack_rows(attention_mask)
        if rows.num_tokens == 0:
            return torch.zeros(input_ids.shape, dtype=torch.float32, device=input_ids.device)
        hidden = packed_hidden_states(model, input_ids, rows)  # [T, H]: packed token j-1 predicts token j
        logprobs = _head_logprobs(head, hidden[:-1], rows.gather(input_ids)[1:], temperature, chunk_size)
        logprobs = torch.nn.functional.pad(logprobs, (1, 0))
        return rows.scatter(torch.where(rows.sequence_starts(), torch.zeros_like(logprobs), logprobs))

    batch_size, seq_len = input_ids.shape
    hidden = last_hidden_states(model, input_ids, attention_mask)
    predicting = hidden[:, :-1].reshape(-1, hidden.shape[-1])  # [B * (S-1), H]: position t-1 predicts token t
    targets = input_ids[:, 1:].reshape(-1)
    shifted = _head_logprobs(head, predicting, targets, temperature, chunk_size)
    logprobs = torch.nn.functional.pad(shifted.view(batch_size, seq_len - 1), (1, 0))
    return torch.where(attention_mask.bool(), logprobs, torch.zeros_like(logprobs))
