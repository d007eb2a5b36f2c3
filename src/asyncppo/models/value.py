"""The value model (critic): a causal LM backbone with a scalar head, right-shifted per-position values.

Called by the value workers (values before an update, critic training) and the checkpointer. The model is
the standard Hugging Face `*ForSequenceClassification` class with num_labels=1, so a saved critic loads with
`AutoModelForSequenceClassification.from_pretrained`. Letters: B batch, S sequence, H hidden size.
"""

import contextlib
import logging
from collections.abc import Iterator
from pathlib import Path

import torch
from torch import nn
from transformers import (
    AutoConfig,
    AutoModelForSequenceClassification,
    PreTrainedModel,
    PreTrainedTokenizerBase,
)
from transformers.models.auto.modeling_auto import MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING

from asyncppo.models.backbone import last_hidden_states, packed_hidden_states
from asyncppo.models.model_directory import require_model_directory
from asyncppo.models.packing import pack_rows

# transformers logs a load report at warning level whenever a weight is missing. A critic built on a causal LM
# always lacks its head, so every run printed "score.weight | MISSING ... Consider training on your downstream
# task", which reads like an error. The report is held during the load and dropped only when the loading info
# says nothing else is wrong; any other report, and every other record of that logger, is logged as written.
_LOAD_REPORT_LOGGER = "transformers.modeling_utils"
_LOAD_REPORT_MARK = "LOAD REPORT"


class _HeldRecords(logging.Filter):
    """A logger filter that keeps every record back, to be released (or not) once the load is done."""

    def __init__(self) -> None:
        super().__init__()
        self.records: list[logging.LogRecord] = []

    def filter(self, record: logging.LogRecord) -> bool:
        self.records.append(record)
        return False


def load_value_model(
    path: str | Path, dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu"
) -> PreTrainedModel:
    """A value model from `path`: a causal LM directory (fresh head) or a saved value model (all weights).

    From a causal LM, the backbone weights load and the head, absent from the checkpoint, is set to zero so
    the critic predicts exactly 0 everywhere before its first update (no random initial bias in the
    advantages). The LM's output head is not used.
    """
    directory = require_model_directory(path)
    config = AutoConfig.from_pretrained(directory, local_files_only=True)
    if type(config) not in MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING:
        raise ValueError(
            f"model type {config.model_type!r} in {str(directory)!r} has no sequence-classification class in "
            "transformers, which the value model is built on; use a decoder such as llama or qwen2"
        )
    config.num_labels = 1
    if getattr(config, "pad_token_id", None) is None:
        # The classification forward (not used by `values`) needs a pad id to find each row's last token;
        # set one so the saved model also works with stock pipelines. transformers 5 configs only carry the
        # special token ids their model declares, hence getattr.
        eos = getattr(config, "eos_token_id", None)
        config.pad_token_id = eos[0] if isinstance(eos, list) else eos
    report_logger = logging.getLogger(_LOAD_REPORT_LOGGER)
    held = _HeldRecords()
    try:
        with _holding(report_logger, held):
            model, loading_info = AutoModelForSequenceClassification.from_pretrained(
                directory, config=config, dtype=dtype, local_files_only=True, output_loading_info=True
            )
    except BaseException:
        _release(report_logger, held.records)  # the report explains the error
        raise
    missing = set(loading_info["missing_keys"])
    backbone_prefix = f"{model.base_model_prefix}."
    # Outside the backbone are only the fresh head (missing) and the LM's output head (unused by a critic).
    heads_only = not loading_info["mismatched_keys"] and not any(
        key.startswith(backbone_prefix) for key in missing | set(loading_info["unexpected_keys"])
    )
    _release(report_logger, [r for r in held.records if not (heads_only and _LOAD_REPORT_MARK in r.getMessage())])
    if missing_backbone := sorted(key for key in missing if key.startswith(backbone_prefix)):
        raise ValueError(f"{str(directory)!r} lacks backbone weights {missing_backbone[:5]} for a value model")
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if name in missing:
                parameter.zero_()
    return model.to(device)


@contextlib.contextmanager
def _holding(logger: logging.Logger, held: _HeldRecords) -> Iterator[None]:
    logger.addFilter(held)
    try:
        yield
    finally:
        logger.removeFilter(held)


def _release(logger: logging.Logger, records: list[logging.LogRecord]) -> None:
    for record in records:
        logger.handle(record)


def value_head(model: PreTrainedModel) -> nn.Module:
    """The scalar head (`score`, H -> 1) of a decoder `*ForSequenceClassification` model."""
    head = getattr(model, "score", None)
    if not isinstance(head, nn.Module):
        raise ValueError(f"{type(model).__name__} has no `score` head; expected a decoder *ForSequenceClassification")
    return head


def values(
    model: PreTrainedModel, input_ids: torch.Tensor, attention_mask: torch.Tensor, packed: bool = False
) -> torch.Tensor:
    """[B, S] fp32 values, right-shifted: values[:, t] = V(state before token t).

    values[:, 0] = 0 and values[:, t] = head(h[:, t-1]) for t >= 1, where h [B, S, H] are the backbone's
    last hidden states; positions where attention_mask is 0 also hold 0. The backbone runs once for all
    positions (the classification forward would pool one position per row). The head runs in the model's
    dtype and its output is cast to fp32. packed: the backbone runs over the real tokens only, back to back, as
    in `policy.token_logprobs`; same output layout.
    """
    if input_ids.dim() != 2 or input_ids.shape[1] == 0:
        raise ValueError(f"input_ids must be [B, S] with S >= 1, got {tuple(input_ids.shape)}")
    if packed:
        rows = pack_rows(attention_mask)
        if rows.num_tokens == 0:
            return torch.zeros(input_ids.shape, dtype=torch.float32, device=input_ids.device)
        hidden = packed_hidden_states(model, input_ids, rows)  # [T, H]: the state before packed token j is h[j-1]
        scores = torch.nn.functional.pad(value_head(model)(hidden[:-1]).float().squeeze(-1), (1, 0))
        return rows.scatter(torch.where(rows.sequence_starts(), torch.zeros_like(scores), scores))
    hidden = last_hidden_states(model, input_ids, attention_mask)
    scores = value_head(model)(hidden[:, :-1]).float().squeeze(-1)  # [B, S-1]: state before token t is h[t-1]
    shifted = torch.nn.functional.pad(scores, (1, 0))
    return torch.where(attention_mask.bool(), shifted, torch.zeros_like(shifted))


def save_value_model(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, path: str | Path) -> Path:
    """Write the value model (safetensors) and its tokenizer into `path` with save_pretrained; returns it."""
    directory = Path(path)
    directory.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory
