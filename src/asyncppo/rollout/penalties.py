"""Reward penalties: zero the reward of gym trajectories that misbehave, before advantages.

Called by the gym rollout runner on each finished group, so the zeroed reward is what GAE sees. Only the
assistant spans of a trajectory (what the policy generated, one span per model call) are inspected:

    trajectory --assistant spans--> decode per span --think tags--> (thoughts, answer, well-formed?) per turn
        |                                                                 |
        +-- generated token ids --> unwanted_tokens      malformed_think_tag, empty_final_answer,
                                                         duplicated_reasoning
"""

import dataclasses
import re
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

from asyncppo.config.runtime import RewardPenaltiesConfig
from asyncppo.types import Trajectory

# duplicated_reasoning: this many consecutive normalised words, found twice without overlap, are a repetition.
# Long enough that re-stating a short result ("so 12 + 7 = 19") is no repetition, short enough for a loop.
MIN_REPEATED_WORDS = 20
_WORD = re.compile(r"\w+")
# Chat-template control tokens left in the text by a decode that keeps special tokens: `<|im_end|>`,
# `<|eot_id|>`, DeepSeek's full-width-bar form, and `</s>`. They are not part of an answer.
_CONTROL_TOKEN = re.compile(r"<[|\uff5c][^<>|\uff5c\s]*[|\uff5c]>|</s>")
DEFAULT_THINKING_TAGS = ("<think>", "</think>")
"""env.gym.thinking_tags' default."""


def enabled_penalties(settings: RewardPenaltiesConfig) -> list[str]:
    """Names of the penalties that are on, in a fixed order (the keys of the counts and of the gym metrics)."""
    switches = {
        "duplicated_reasoning": settings.penalize_duplicated_reasoning,
        "empty_final_answer": settings.penalize_empty_final_answer,
        "unwanted_tokens": settings.penalize_unwanted_tokens,
        "malformed_think_tag": settings.penalize_malformed_think_tag,
        "invalid_tool_call": settings.penalize_invalid_tool_call,
    }
    return [name for name, on in switches.items() if on]


@dataclass(frozen=True)
class ThinkSplit:
    """One assistant turn's text cut at its think tags."""

    thoughts: str
    """Text inside think blocks (an unclosed block runs to the end of the turn), blocks joined by newlines."""
    answer: str
    """Text outside think blocks, with control tokens removed and whitespace stripped."""
    well_formed: bool
    """No tags, or exactly one start tag followed later by one end tag."""


def split_think(text: str, think_start: str, think_end: str) -> ThinkSplit:
    """Cut `text` at its think tags, reading them left to right with a depth counter.

    Malformed: a start tag inside an open block (nesting), an end tag with no open block, a block still open
    at the end, or more than one block. A stray end tag closes nothing; the text before it stays in the answer.
    """
    tags = re.compile(f"({re.escape(think_start)})|{re.escape(think_end)}")
    thoughts: list[str] = []
    answer: list[str] = []
    depth = num_blocks = position = 0
    well_formed = True
    for match in tags.finditer(text):
        (thoughts if depth else answer).append(text[position : match.start()])
        position = match.end()
        if match.group(1) is not None:
            if depth:
                well_formed = False  # nested
            else:
                num_blocks += 1
            depth += 1
        elif depth:
            depth -= 1
        else:
            well_formed = False  # an end tag before any start
    (thoughts if depth else answer).append(text[position:])
    well_formed = well_formed and depth == 0 and num_blocks <= 1
    return ThinkSplit("\n".join(thoughts), _CONTROL_TOKEN.sub("", "".join(answer)).strip(), well_formed)


def has_repeated_words(texts: Sequence[str], min_words: int = MIN_REPEATED_WORDS) -> bool:
    """Whether `min_words` consecutive words occur twice without overlapping, within one text or across two.

    Words are the lower-cased runs of letters, digits and underscores (punctuation and spacing ignored). A window
    never spans two texts. Cost: one hash of each window, O(total words * min_words).
    """
    first_start: dict[tuple[str, ...], int] = {}
    offset = 0
    for text in texts:
        words = _WORD.findall(text.lower())
        for start in range(len(words) - min_words + 1):
            window = tuple(words[start : start + min_words])
            earlier = first_start.setdefault(window, offset + start)
            if offset + start - earlier >= min_words:
                return True
        offset += len(words) + min_words  # a gap, so windows of different texts never count as overlapping
    return False


def apply_reward_penalties(
    trajectories: Sequence[Trajectory],
    settings: RewardPenaltiesConfig,
    decode: Callable[[Sequence[int]], str],
    thinking_tags: tuple[str, str] = DEFAULT_THINKING_TAGS,
) -> tuple[list[Trajectory], dict[str, int]]:
    """Returns new trajectories (dataclasses.replace; inputs untouched) whose reward is 0.0 when any enabled penalty
    applies, and counts {penalty name: number of trajectories it hit} for every enabled penalty (0 included).

    `decode` turns one assistant span's token ids into text; it must keep the think tags (with tokenizers that
    make them special tokens, decode with `skip_special_tokens=False`; control tokens such as `<|im_end|>` are
    ignored here). `thinking_tags` (env.gym.thinking_tags) are the [start, end] tags of a think block. Each
    enabled penalty, on the assistant spans (the policy's generations, one per model call):

    - `unwanted_tokens`: a generated token (loss mask 1) is in `token_ids_unwanted`. No decoding.
    - `malformed_think_tag`: some turn is not well formed (`split_think`): nested tags, an end before a start,
      a block left open (a turn cut inside its thinking counts), or more than one block in the turn. The model
      must write its own start tag: a chat template that opens the block in the prompt reads as malformed.
    - `empty_final_answer`: the last assistant turn's text outside think blocks, control tokens removed and
      whitespace stripped, is empty (so is a trajectory without assistant turns). A final turn that only calls
      a tool is not empty (its tool-call markup is text): whether the rollout should have ended on an answer is
      the environment's call.
    - `duplicated_reasoning`: the think text of all turns repeats `MIN_REPEATED_WORDS` consecutive words
      (`has_repeated_words`): a loop, a re-pasted paragraph, or a long think block copied into a later turn.
      Shorter repeats (a restated intermediate result, a one-line block recurring in every tool turn) pass.
    - `invalid_tool_call`: the trajectory is flagged `invalid_tool_call` (the gym client matched
      env.gym.invalid_tool_call_patterns against its assistant messages' text). No decoding.

    A hit sets `reward` to 0.0 (zeroed, not negated: a negative reward also becomes 0) and every entry of
    `reward_components` to 0.0 (names kept, so they still sum to the reward). A trajectory whose reward was
    already 0 is still counted. Trajectories that no penalty hits are returned as they are (same objects).
    """
    enabled = enabled_penalties(settings)
    counts = dict.fromkeys(enabled, 0)
    penalized: list[Trajectory] = []
    for trajectory in trajectories:
        hits = _hits(trajectory, settings, decode, thinking_tags) if enabled else []
        for name in hits:
            counts[name] += 1
        if hits:
            zeroed = {name: 0.0 for name in trajectory.reward_components}
            trajectory = dataclasses.replace(trajectory, reward=0.0, reward_components=zeroed)
        penalized.append(trajectory)
    return penalized, counts


def _hits(
    trajectory: Trajectory,
    settings: RewardPenaltiesConfig,
    decode: Callable[[Sequence[int]], str],
    thinking_tags: tuple[str, str],
) -> list[str]:
    """Names of the enabled penalties that apply to `trajectory`."""
    hits: list[str] = []
    if settings.penalize_invalid_tool_call and trajectory.invalid_tool_call:
        hits.append("invalid_tool_call")
    if settings.penalize_unwanted_tokens:
        unwanted = frozenset(settings.token_ids_unwanted)
        generated = (token for token, mask in zip(trajectory.token_ids, trajectory.loss_mask, strict=True) if mask)
        if any(token in unwanted for token in generated):
            hits.append("unwanted_tokens")
    malformed = settings.penalize_malformed_think_tag
    empty_answer = settings.penalize_empty_final_answer
    duplicated = settings.penalize_duplicated_reasoning
    if not (malformed or empty_answer or duplicated):
        return hits
    texts = [decode(span) for span in _assistant_spans(trajectory)]
    think_start, think_end = thinking_tags
    turns = [split_think(text, think_start, think_end) for text in texts]
    if malformed and not all(turn.well_formed for turn in turns):
        hits.append("malformed_think_tag")
    if empty_answer and (not turns or not turns[-1].answer):
        hits.append("empty_final_answer")
    if duplicated and has_repeated_words([turn.thoughts for turn in turns]):
        hits.append("duplicated_reasoning")
    return hits


def _assistant_spans(trajectory: Trajectory) -> Iterator[list[int]]:
    """The token ids of each assistant span, in order."""
    position = 0
    for span in trajectory.message_log:
        if span.role == "assistant":
            yield trajectory.token_ids[position : position + span.num_tokens]
        position += span.num_tokens
