"""The privileged critic's tokenizer side: reference blocks as token prefixes, and batches in the critic layout.

    step trajectories --PrivilegedCritic.prefixes--> CriticPrefixes   (driver, before collate; one block per group)
    TrainBatch + CriticPrefixes --critic_layout--> PrefixedLayout --critic_batch--> TrainBatch [B, W]   (ppo_step)

A block is the system message `apply_chat_template([{"role": "system", "content": block}], tokenize=False)`
encoded without special tokens, PREPENDED to the verbatim trajectory ids: the value head is causal, so the
block must precede every supervised token. The policy batch is never changed. Letters: B rows, S policy-layout
positions, W critic-layout positions.
"""

import logging
from collections.abc import Sequence
from dataclasses import dataclass, fields
from typing import cast

import torch
from transformers import PreTrainedTokenizerBase

from asyncppo.algorithms.privilege import (
    PrefixedLayout,
    ReferenceBlock,
    prepend_prefixes,
    privilege_metrics,
    render_reference_block,
)
from asyncppo.config.models import PrivilegedCriticConfig
from asyncppo.models.tokenizer import decode_ids, encode_text, render_chat_text
from asyncppo.types import MessageSpan, TrainBatch, Trajectory

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class CriticPrefixes:
    """One step's prefixes, in the row order of its batch: token_ids[i] is row i's block (empty without one)."""

    token_ids: tuple[tuple[int, ...], ...]
    pad_token_id: int
    """Pads the critic layout's rows (the policy batch's pad id)."""
    metrics: dict[str, float]
    """privilege/* of the step (`algorithms.privilege.privilege_metrics`)."""


class PrivilegedCritic:
    """Builds the critic's prefixes from trajectories' task fields with the run's tokenizer."""

    def __init__(self, tokenizer: PreTrainedTokenizerBase, settings: PrivilegedCriticConfig, pad_token_id: int) -> None:
        self.tokenizer = tokenizer
        self.settings = settings
        self.pad_token_id = pad_token_id

    def _encode(self, text: str) -> list[int]:
        return encode_text(self.tokenizer, text, add_special_tokens=False)

    def count_tokens(self, text: str) -> int:
        return len(self._encode(text))

    def truncate(self, text: str, num_tokens: int) -> str:
        """The first `num_tokens` tokens of `text`, decoded (a cut inside a multi-byte character may show as U+FFFD)."""
        return decode_ids(self.tokenizer, self._encode(text)[:num_tokens])

    def block_token_ids(self, block: str) -> list[int]:
        """The block rendered as a lone system message with the chat template, encoded without special tokens."""
        return self._encode(render_chat_text(self.tokenizer, [{"role": "system", "content": block}]))

    def render(self, task: dict[str, object]) -> ReferenceBlock | None:
        """The reference block of one task, or None when it has none of the configured fields."""
        return render_reference_block(task, self.settings, self.count_tokens, self.truncate)

    def prefixes(self, trajectories: Sequence[Trajectory]) -> CriticPrefixes:
        """Per-trajectory prefix ids and privilege/* metrics; siblings of a group share one (byte-identical) block.

        ValueError when no trajectory has any configured field (a misnamed field would otherwise train a plain
        critic silently); rows without one get no block and one warning per call with their count.
        """
        by_group: dict[int, tuple[ReferenceBlock | None, tuple[int, ...]]] = {}
        for trajectory in trajectories:
            if trajectory.group_id not in by_group:
                block = self.render(trajectory.task)
                ids = tuple(self.block_token_ids(block.text)) if block is not None else ()
                by_group[trajectory.group_id] = (block, ids)
        rows = [by_group[trajectory.group_id] for trajectory in trajectories]
        names = [field.name for field in self.settings.fields]
        missing = sum(block is None for block, _ in rows)
        if rows and missing == len(rows):
            keys = sorted(trajectories[0].task)
            raise ValueError(
                f"value.privileged_critic: none of the {len(rows)} trajectories of the step has any of the task "
                f"fields {names} (the first one's task keys: {keys}); check value.privileged_critic.fields"
            )
        if missing:
            log.warning(
                "value.privileged_critic: %d of %d trajectories have none of the task fields %s; their critic "
                "sequences get no reference block",
                missing,
                len(rows),
                names,
            )
        metrics = privilege_metrics([block for block, _ in rows], [len(ids) for _, ids in rows], self.settings.fields)
        return CriticPrefixes(tuple(ids for _, ids in rows), self.pad_token_id, metrics)


def critic_layout(batch: TrainBatch, prefixes: CriticPrefixes) -> PrefixedLayout:
    """Where the batch's tokens sit once each row gets its prefix."""
    return prepend_prefixes(batch.input_ids, batch.attention_mask, prefixes.token_ids, prefixes.pad_token_id)


def critic_batch(batch: TrainBatch, layout: PrefixedLayout) -> TrainBatch:
    """The batch in the critic layout: prefixed ids, every `[B, S]` field moved by `layout.to_critic` (0 on the
    prefix, so no mask ever selects a prefix position), prompt_lengths grown by the prefix, a system span leading
    each prefixed message log. `[B]` fields are unchanged: rows keep their order, so `[B]` offsets still apply."""
    updates: dict[str, object] = {}
    for spec in fields(batch):
        value = getattr(batch, spec.name)
        if spec.name in ("input_ids", "attention_mask") or not isinstance(value, torch.Tensor):
            continue
        if value.dim() == 2 and value.shape[1] == batch.seq_len:
            updates[spec.name] = layout.to_critic(value)
    # torch's stub types tolist() as a bare `list`; a 1-D integer tensor gives a list of ints.
    prefix_lengths = cast(list[int], layout.prefix_lengths.tolist())  # pyright: ignore[reportUnknownMemberType]
    return batch.with_fields(
        **updates,
        input_ids=layout.input_ids,
        attention_mask=layout.attention_mask,
        prompt_lengths=batch.prompt_lengths + layout.prefix_lengths.to(batch.prompt_lengths.device),
        message_logs=tuple(
            ((MessageSpan("system", length), *messages) if length else messages)
            for messages, length in zip(batch.message_logs, prefix_lengths, strict=True)
        ),
    )
