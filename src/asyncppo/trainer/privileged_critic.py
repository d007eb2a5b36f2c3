"""The privileged critic's tokenizer side: reference blocks as token insertions, and batches in the critic layout.

    step trajectories --PrivilegedCritic.prefixes--> CriticPrefixes   (driver, before collate; one block per group)
    TrainBatch + CriticPrefixes --critic_layout--> PrefixedLayout --critic_batch--> TrainBatch [B, W]   (ppo_step)

The note is `value.privileged_critic.template` with the block as `{answer}`; `placement` says where its ids go in
the critic's copy of the verbatim trajectory ids (the policy batch is never changed):

    user_suffix  ... <user header>{user text}  + "\n\n{note}" +  <end of turn> ... <assistant header>{response}
    user_prefix  ... <user header>  + "{note}\n\n" +  {user text}<end of turn> ... <assistant header>{response}
    system       the note rendered as a lone system message, before everything (a prompt without a user
                 message gets this too)

The user message is the prompt's last one (before the first assistant turn), found by the chat template's user
header and end-of-turn ids; the note's ids are encoded on their own, the trajectory's are never re-tokenised.
Every placement puts the note inside the prompt, so it precedes every supervised token (the value head is
causal). Letters: B rows, S policy-layout positions, W critic-layout positions.
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
    insert_into_rows,
    privilege_metrics,
    render_reference_block,
)
from asyncppo.config.models import PRIVILEGE_PLACEHOLDER, PrivilegedCriticConfig
from asyncppo.models.tokenizer import decode_ids, encode_text, render_chat_text
from asyncppo.types import MessageSpan, TrainBatch, Trajectory

log = logging.getLogger(__name__)


# Stands for a message's content while the chat template is probed for the user header and end-of-turn text.
_SENTINEL = "PRIVILEGED-CRITIC-CONTENT"
# Between the note and the user's own text.
_NOTE_SEPARATOR = "\n\n"


@dataclass(frozen=True)
class CriticPrefixes:
    """One step's insertions, in the row order of its batch: token_ids[i] is row i's note (empty without one),
    spliced in before its token at positions[i] (0 = a prefix)."""

    token_ids: tuple[tuple[int, ...], ...]
    pad_token_id: int
    """Pads the critic layout's rows (the policy batch's pad id)."""
    metrics: dict[str, float]
    """privilege/* of the step (`algorithms.privilege.privilege_metrics`)."""
    positions: tuple[int, ...] | None = None
    """Insert position of each row; None = all 0."""


def _find_last(haystack: Sequence[int], needle: Sequence[int], end: int) -> int | None:
    """Start of the last occurrence of `needle` in haystack[:end], or None."""
    size, target = len(needle), list(needle)
    for start in range(end - size, -1, -1):
        if haystack[start] == target[0] and list(haystack[start : start + size]) == target:
            return start
    return None


def _find_first(haystack: Sequence[int], needle: Sequence[int], start: int, end: int) -> int | None:
    """Start of the first occurrence of `needle` in haystack[start:end], or None."""
    size, target = len(needle), list(needle)
    for position in range(start, end - size + 1):
        if haystack[position] == target[0] and list(haystack[position : position + size]) == target:
            return position
    return None


class PrivilegedCritic:
    """Builds the critic's prefixes from trajectories' task fields with the run's tokenizer."""

    def __init__(self, tokenizer: PreTrainedTokenizerBase, settings: PrivilegedCriticConfig, pad_token_id: int) -> None:
        self.tokenizer = tokenizer
        self.settings = settings
        self.pad_token_id = pad_token_id
        self.user_header_ids, self.end_of_turn_ids = self._user_turn_markers()

    def _user_turn_markers(self) -> tuple[list[int], list[int]]:
        """(ids that open a user message's content, ids that close it), from the chat template.

        A lone user message renders as `[default system ...] <header> content <end of turn>[whitespace]`: the end
        of turn is what follows the content, stripped; the header is what precedes it, after any earlier end of
        turn (a default system message some templates add)."""
        rendered = render_chat_text(self.tokenizer, [{"role": "user", "content": _SENTINEL}])
        before, found, after = rendered.partition(_SENTINEL)
        end_of_turn = after.rstrip()
        if not found or not end_of_turn or not before:
            if self.settings.placement != "system":
                raise ValueError(
                    f"value.privileged_critic.placement {self.settings.placement!r}: the chat template does not mark "
                    f"where a user message starts and ends (a lone user message renders as {rendered!r}); use "
                    "placement: system"
                )
            return [], []
        header = before.rsplit(end_of_turn, 1)[-1].lstrip()
        return self._encode(header), self._encode(end_of_turn)

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

    def note(self, block: str) -> str:
        """The template with the block in place of `{answer}`."""
        return self.settings.template.format(**{PRIVILEGE_PLACEHOLDER: block})

    def insertion(self, trajectory: Trajectory, note: str) -> tuple[int, list[int]]:
        """(position, ids) of the note in this trajectory's critic copy, by `placement`; the system placement when
        the prompt has no user message the template markers find."""
        prompt = trajectory.token_ids[: trajectory.prompt_length]
        if self.settings.placement != "system":
            header = _find_last(prompt, self.user_header_ids, len(prompt))
            if header is not None:
                content_start = header + len(self.user_header_ids)
                if self.settings.placement == "user_prefix":
                    return content_start, self._encode(note + _NOTE_SEPARATOR)
                content_end = _find_first(prompt, self.end_of_turn_ids, content_start, len(prompt))
                if content_end is not None:
                    return content_end, self._encode(_NOTE_SEPARATOR + note)
        return 0, self.block_token_ids(note)

    def render(self, task: dict[str, object]) -> ReferenceBlock | None:
        """The reference block of one task, or None when it has none of the configured fields."""
        return render_reference_block(task, self.settings, self.count_tokens, self.truncate)

    def prefixes(self, trajectories: Sequence[Trajectory]) -> CriticPrefixes:
        """Per-trajectory prefix ids and privilege/* metrics; siblings of a group share one (byte-identical) block.

        ValueError when no trajectory has any configured field (a misnamed field would otherwise train a plain
        critic silently); rows without one get no block and one warning per call with their count.
        """
        blocks: dict[int, ReferenceBlock | None] = {}
        # Keyed by group and prompt: siblings share one note, and (with the same prompt) one search for its place.
        insertions: dict[tuple[int, tuple[int, ...]], tuple[int, tuple[int, ...]]] = {}
        rows: list[tuple[ReferenceBlock | None, tuple[int, ...]]] = []
        positions: list[int] = []
        for trajectory in trajectories:
            if trajectory.group_id not in blocks:
                blocks[trajectory.group_id] = self.render(trajectory.task)
            block = blocks[trajectory.group_id]
            key = (trajectory.group_id, tuple(trajectory.token_ids[: trajectory.prompt_length]))
            if key not in insertions:
                position, ids = self.insertion(trajectory, self.note(block.text)) if block is not None else (0, [])
                insertions[key] = (position, tuple(ids))
            position, ids = insertions[key]
            rows.append((block, ids))
            positions.append(position)
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
        return CriticPrefixes(tuple(ids for _, ids in rows), self.pad_token_id, metrics, tuple(positions))


def critic_layout(batch: TrainBatch, prefixes: CriticPrefixes) -> PrefixedLayout:
    """Where the batch's tokens sit once each row gets its note."""
    positions = prefixes.positions if prefixes.positions is not None else (0,) * len(prefixes.token_ids)
    return insert_into_rows(batch.input_ids, batch.attention_mask, positions, prefixes.token_ids, prefixes.pad_token_id)


def _with_insertion(messages: tuple[MessageSpan, ...], position: int, length: int) -> tuple[MessageSpan, ...]:
    """The message spans once `length` tokens are inserted before `position`: a leading system span at 0, else
    the span holding that position grows (the note joins the user message it was put in)."""
    if not length:
        return messages
    if position == 0:
        return (MessageSpan("system", length), *messages)
    grown: list[MessageSpan] = []
    start = 0
    for span in messages:
        inside = start <= position < start + span.num_tokens
        grown.append(MessageSpan(span.role, span.num_tokens + length) if inside else span)
        start += span.num_tokens
    return tuple(grown)


def critic_batch(batch: TrainBatch, layout: PrefixedLayout) -> TrainBatch:
    """The batch in the critic layout: ids with the notes, every `[B, S]` field moved by `layout.to_critic` (0 on
    the note, so no mask ever selects a note position), prompt_lengths grown by the note (always inside the
    prompt), message logs with a leading system span (a prefix) or the note inside its user span. `[B]` fields are
    unchanged: rows keep their order, so `[B]` offsets still apply."""
    updates: dict[str, object] = {}
    for spec in fields(batch):
        value = getattr(batch, spec.name)
        if spec.name in ("input_ids", "attention_mask") or not isinstance(value, torch.Tensor):
            continue
        if value.dim() == 2 and value.shape[1] == batch.seq_len:
            updates[spec.name] = layout.to_critic(value)
    # torch's stub types tolist() as a bare `list`; a 1-D integer tensor gives a list of ints.
    prefix_lengths = cast(list[int], layout.prefix_lengths.tolist())  # pyright: ignore[reportUnknownMemberType]
    positions = cast(list[int], layout.insert_positions.tolist())  # pyright: ignore[reportUnknownMemberType]
    return batch.with_fields(
        **updates,
        input_ids=layout.input_ids,
        attention_mask=layout.attention_mask,
        prompt_lengths=batch.prompt_lengths + layout.prefix_lengths.to(batch.prompt_lengths.device),
        message_logs=tuple(
            _with_insertion(messages, position, length)
            for messages, position, length in zip(batch.message_logs, positions, prefix_lengths, strict=True)
        ),
    )
