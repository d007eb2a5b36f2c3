"""Privileged critic (asymmetric actor-critic), the pure parts: the reference block and the two batch layouts.

Called by `trainer/privileged_critic.py` (rendering, tokenizer side) and `trainer/ppo_step.py` (layouts). Shapes: B
batch, S policy-layout positions, W critic-layout positions. The policy never sees any of this.

    task fields --read_task_field / field_text--> texts --fit_to_budget--> FieldOutcomes --> `<reference>` block
    policy batch [B, S] + per-row (position, ids) --insert_into_rows--> PrefixedLayout [B, W]:
        row i = its verbatim ids with the block's ids spliced in at position_i (0 = a prefix), right-padded
        to_critic: returns, critic mask, every [B, S] field   policy [B, S] --> critic [B, W]
        to_policy: critic values                              critic [B, W] --> policy [B, S]
"""

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal, cast

import torch

from asyncppo.config.models import PrivilegedCriticConfig, PrivilegedFieldConfig

TRUNCATION_MARKER = "\n... [truncated]"
OMISSION_MARKER = "... [omitted: token budget]"

CountTokens = Callable[[str], int]
"""Number of tokens of a text."""
Truncate = Callable[[str, int], str]
"""(text, n) -> a prefix of the text of at most about n tokens (fit_to_budget re-counts and shrinks if needed)."""


def _child(node: object, key: str) -> object | None:
    if not isinstance(node, Mapping):
        return None
    mapping = cast(Mapping[object, object], node)
    return mapping.get(key)


def read_task_field(task: Mapping[str, object], path: str) -> object | None:
    """task[path] when `path` is a key; else the dotted walk task[a][b][c] through nested mappings; None if absent."""
    if path in task:
        return task[path]
    current: object | None = task
    for part in path.split("."):
        current = _child(current, part)
        if current is None:
            return None
    return current


def _item_text(value: object) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, Mapping | list | tuple | bool | int | float) or value is None:
        return json.dumps(value, sort_keys=True, ensure_ascii=False)
    return str(value)


def field_text(value: object) -> str | None:
    """The text of a task value, or None when it has no content (missing, blank, empty list or dict).

    Strings are kept verbatim; lists give one item per line (strings verbatim, anything else as JSON); dicts
    and scalars are JSON with sorted keys, so the text never depends on insertion order.
    """
    if value is None:
        return None
    if isinstance(value, list | tuple):
        text = "\n".join(_item_text(item) for item in cast(Sequence[object], value))
    else:
        text = _item_text(value)
        if text == "{}" and not isinstance(value, str):
            return None  # an empty dict
    return text if text.strip() else None


@dataclass(frozen=True)
class FieldOutcome:
    """What the budget left of one field: `text` as emitted (markers included), the field's own tokens wanted and
    kept (markers excluded), and whether it is whole, truncated or omitted."""

    field: PrivilegedFieldConfig
    text: str
    wanted_tokens: int
    kept_tokens: int
    status: Literal["whole", "truncated", "omitted"]


def _truncate_within(text: str, room: int, count_tokens: CountTokens, truncate: Truncate) -> tuple[str, int]:
    """(prefix of text, its tokens) with tokens <= room; re-encoding a cut text can merge differently, so re-count."""
    target = room
    while target > 0:
        kept = truncate(text, target)
        num_tokens = count_tokens(kept)
        if num_tokens <= room:
            return kept, num_tokens
        target -= max(1, num_tokens - room)
    return "", 0


def fit_to_budget(
    texts: Sequence[tuple[PrivilegedFieldConfig, str]],
    max_total_tokens: int,
    count_tokens: CountTokens,
    truncate: Truncate,
) -> list[FieldOutcome]:
    """Spend `max_total_tokens` on the fields in the given (priority) order.

    A field's limit is min(tokens left, its max_tokens). Within the limit it is kept whole; over it, it is cut to
    limit - tokens(TRUNCATION_MARKER) tokens and ends with the marker (the marker is charged to the budget);
    when that leaves no room for a single token it becomes OMISSION_MARKER (charged nothing). Deterministic for
    deterministic count_tokens and truncate.
    """
    marker_tokens = count_tokens(TRUNCATION_MARKER)
    remaining = max_total_tokens
    outcomes: list[FieldOutcome] = []
    for field, text in texts:
        wanted = count_tokens(text)
        limit = remaining if field.max_tokens is None else min(remaining, field.max_tokens)
        if wanted <= limit:
            outcomes.append(FieldOutcome(field, text, wanted, wanted, "whole"))
            remaining -= wanted
            continue
        kept_text, kept = _truncate_within(text, limit - marker_tokens, count_tokens, truncate)
        if kept == 0:
            outcomes.append(FieldOutcome(field, OMISSION_MARKER, wanted, 0, "omitted"))
            continue
        outcomes.append(FieldOutcome(field, kept_text + TRUNCATION_MARKER, wanted, kept, "truncated"))
        remaining -= kept + marker_tokens
    return outcomes


@dataclass(frozen=True)
class ReferenceBlock:
    """The rendered block of one task and the fate of each of its fields (fields without content are absent)."""

    text: str
    outcomes: tuple[FieldOutcome, ...]

    @property
    def truncated(self) -> bool:
        """Some field was cut or omitted by the budget."""
        return any(outcome.status != "whole" for outcome in self.outcomes)

    @property
    def dropped_tokens(self) -> int:
        """Field tokens the budget cut: sum of wanted - kept."""
        return sum(outcome.wanted_tokens - outcome.kept_tokens for outcome in self.outcomes)


def format_reference_block(outcomes: Sequence[FieldOutcome]) -> str:
    """`<reference>\\n<{title}>\\n{text}\\n</{title}>\\n...</reference>` in the order given."""
    body = "".join(f"<{o.field.resolved_title}>\n{o.text}\n</{o.field.resolved_title}>\n" for o in outcomes)
    return f"<reference>\n{body}</reference>"


def render_reference_block(
    task: Mapping[str, object], settings: PrivilegedCriticConfig, count_tokens: CountTokens, truncate: Truncate
) -> ReferenceBlock | None:
    """The block of one task, or None when none of the configured fields has content in it."""
    texts: list[tuple[PrivilegedFieldConfig, str]] = []
    for field in settings.fields:
        text = field_text(read_task_field(task, field.name))
        if text is not None:
            texts.append((field, text))
    if not texts:
        return None
    outcomes = fit_to_budget(texts, settings.max_total_tokens, count_tokens, truncate)
    return ReferenceBlock(format_reference_block(outcomes), tuple(outcomes))


def privilege_metrics(
    blocks: Sequence[ReferenceBlock | None], block_tokens: Sequence[int], fields: Sequence[PrivilegedFieldConfig]
) -> dict[str, float]:
    """privilege/* over the rows of one batch; `block_tokens[i]` is row i's prefix length (0 without a block).

    Over rows with a block: frac_truncated (any field cut or omitted), block_tokens_mean / _max (prefix tokens,
    template included), dropped_tokens_mean, frac_truncated_<title> (that field cut or omitted). Over all rows:
    n_rows_without_privilege. Only n_rows_without_privilege when no row has a block.
    """
    if len(blocks) != len(block_tokens):
        raise ValueError(f"{len(blocks)} blocks but {len(block_tokens)} block lengths")
    present = [(block, tokens) for block, tokens in zip(blocks, block_tokens, strict=True) if block is not None]
    metrics = {"privilege/n_rows_without_privilege": float(len(blocks) - len(present))}
    if not present:
        return metrics
    count = float(len(present))
    metrics["privilege/frac_truncated"] = sum(block.truncated for block, _ in present) / count
    metrics["privilege/block_tokens_mean"] = sum(tokens for _, tokens in present) / count
    metrics["privilege/block_tokens_max"] = float(max(tokens for _, tokens in present))
    metrics["privilege/dropped_tokens_mean"] = sum(block.dropped_tokens for block, _ in present) / count
    for field in fields:
        cut = sum(
            any(o.field.resolved_title == field.resolved_title and o.status != "whole" for o in block.outcomes)
            for block, _ in present
        )
        metrics[f"privilege/frac_truncated_{field.resolved_title}"] = cut / count
    return metrics


def remap_between_masks(source: torch.Tensor, source_mask: torch.Tensor, target_mask: torch.Tensor) -> torch.Tensor:
    """Move per-token values between two layouts: `[B, S_src]` -> `[B, S_dst]`.

    In each row the k-th set position of target_mask receives the value at the k-th set position of
    source_mask; every other position is 0. The masks must
    set the same number of positions in every row (ValueError naming the first row that differs), which makes
    the move invertible on the masked positions. dtype and device follow `source`.
    """
    if source.dim() != 2 or source.shape != source_mask.shape:
        raise ValueError(f"source {tuple(source.shape)} and source_mask {tuple(source_mask.shape)} must be one [B, S]")
    if target_mask.dim() != 2 or target_mask.shape[0] != source.shape[0]:
        raise ValueError(f"target_mask {tuple(target_mask.shape)} must be [B={source.shape[0]}, S_dst]")
    source_valid, target_valid = source_mask.bool(), target_mask.bool()
    mismatched = (source_valid.sum(dim=1) != target_valid.sum(dim=1).to(source_valid.device)).nonzero()
    if mismatched.numel():
        row = int(mismatched[0, 0])
        raise ValueError(
            f"row {row}: source_mask sets {int(source_valid[row].sum())} positions but target_mask sets "
            f"{int(target_valid[row].sum())}; a remap needs equal counts per row"
        )
    out = source.new_zeros(tuple(target_mask.shape))
    # Boolean indexing walks row-major, so with equal per-row counts the k-th value of row i lands in row i.
    out[target_valid.to(source.device)] = source[source_valid]
    return out


@dataclass(frozen=True)
class PrefixedLayout:
    """The critic layout of a right-padded batch: row i = its tokens with insertion_i spliced in before position
    insert_positions[i] (0 = a prefix), right-padded to W.

    input_ids / attention_mask `[B, W]`; conversation_mask `[B, W]` bool (the policy tokens' positions there);
    policy_mask `[B, S]` bool (the same tokens in the policy layout); prefix_lengths `[B]` long (tokens inserted);
    insert_positions `[B]` long (policy-layout position the insertion precedes).
    """

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    conversation_mask: torch.Tensor
    policy_mask: torch.Tensor
    prefix_lengths: torch.Tensor
    insert_positions: torch.Tensor

    def to_critic(self, policy_tensor: torch.Tensor) -> torch.Tensor:
        """`[B, S]` -> `[B, W]`: every position from the insertion on shifted right by its length; 0 on the
        inserted positions and padding."""
        return remap_between_masks(policy_tensor, self.policy_mask, self.conversation_mask)

    def to_policy(self, critic_tensor: torch.Tensor) -> torch.Tensor:
        """`[B, W]` -> `[B, S]`: the inverse move; inserted positions are dropped, padding is 0."""
        return remap_between_masks(critic_tensor, self.conversation_mask, self.policy_mask)


def prepend_prefixes(
    input_ids: torch.Tensor, attention_mask: torch.Tensor, prefixes: Sequence[Sequence[int]], pad_token_id: int
) -> PrefixedLayout:
    """The critic layout of a right-padded batch `[B, S]`: prefixes[i] (possibly empty) before row i's tokens."""
    return insert_into_rows(input_ids, attention_mask, [0] * len(prefixes), prefixes, pad_token_id)


def insert_into_rows(
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    positions: Sequence[int],
    insertions: Sequence[Sequence[int]],
    pad_token_id: int,
) -> PrefixedLayout:
    """The critic layout of a right-padded batch `[B, S]`: insertions[i] (possibly empty) spliced into row i just
    before its token at positions[i] (0 <= positions[i] <= the row's length).

    Row i becomes ids[:p] + insertion + ids[p:length]; the row's own ids are copied, never re-tokenised.
    W = max_i (len(insertion_i) + length_i), at least 1.
    """
    batch_size = input_ids.shape[0]
    for name, count in (("insertions", len(insertions)), ("positions", len(positions))):
        if count != batch_size:
            raise ValueError(f"{count} {name} for a batch of {batch_size} rows")
    device = input_ids.device
    policy_mask = attention_mask.bool()
    lengths = policy_mask.sum(dim=1)
    columns_in = torch.arange(input_ids.shape[1], device=device)
    if not torch.equal(policy_mask, columns_in.unsqueeze(0) < lengths.unsqueeze(1)):
        raise ValueError("the critic layout needs right padding: every row's attention_mask must be 1s then 0s")
    starts = torch.tensor(list(positions), dtype=torch.long, device=device)
    bad = ((starts < 0) | (starts > lengths)).nonzero()
    if bad.numel():
        row = int(bad[0, 0])
        raise ValueError(f"row {row}: insert position {positions[row]} is outside 0..{int(lengths[row])}")
    inserted = torch.tensor([len(insertion) for insertion in insertions], dtype=torch.long, device=device)
    totals = inserted + lengths
    width = max(int(totals.max().item()) if batch_size else 0, 1)
    columns = torch.arange(width, device=device).unsqueeze(0)
    insert_mask = (columns >= starts.unsqueeze(1)) & (columns < (starts + inserted).unsqueeze(1))
    conversation_mask = ~insert_mask & (columns < totals.unsqueeze(1))
    ids = torch.full((batch_size, width), pad_token_id, dtype=input_ids.dtype, device=device)
    flat_insertions = [token for insertion in insertions for token in insertion]
    ids[insert_mask] = torch.tensor(flat_insertions, dtype=input_ids.dtype, device=device)
    # Row-major boolean indexing keeps each row's tokens in order, so the k-th policy token lands on the k-th
    # non-inserted position of its row: before the insertion for k < p, after it otherwise.
    ids[conversation_mask] = input_ids[policy_mask]
    return PrefixedLayout(
        input_ids=ids,
        attention_mask=(columns < totals.unsqueeze(1)).to(attention_mask.dtype),
        conversation_mask=conversation_mask,
        policy_mask=policy_mask,
        prefix_lengths=inserted,
        insert_positions=starts,
    )
