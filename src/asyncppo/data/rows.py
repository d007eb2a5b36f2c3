"""Dataset rows: loading prompt rows from JSONL or a local Hugging Face dataset, checking them, splitting them.

The trainer's pre-flight calls `load_rows` (and `split_rows` when no validation file is given) and hands the rows
to `PromptStream`; rows read elsewhere (a Hub dataset: data/hub.py) are checked with `canonical_rows` or
`check_gym_rows`; rollouts turn a row into a conversation with `prompt_messages`. A row is a plain dict with a
chat prompt under `messages` or a plain-text one under `prompt`, plus task fields (e.g. `answer`, which
`copy_answer_field` fills from another field).
"""

import json
import random
from pathlib import Path
from typing import Any, cast

PROMPT_KEY = "prompt"
MESSAGES_KEY = "messages"


class MissingPromptFieldError(ValueError):
    """A row holds neither prompt field; `where` names the file and row, `fields` lists the fields it has."""

    def __init__(self, where: str, wanted: tuple[str, ...], fields: list[str]):
        self.where = where
        self.wanted = wanted
        self.fields = fields
        shown = " or ".join(repr(key) for key in wanted)
        super().__init__(f"{where}: has no prompt field {shown}; keys found: {fields}")


def load_rows(
    path: str | Path,
    prompt_key: str | None = PROMPT_KEY,
    messages_key: str | None = MESSAGES_KEY,
    split: str | None = None,
) -> list[dict[str, Any]]:
    """The rows of a `.jsonl` file (one JSON object per line) or of a directory written by `save_to_disk`.

    The prompt is read from `messages_key` (a list of {role, content}) or, when the row has none, from
    `prompt_key` (a string); either key may be None to ignore that field. Returned rows hold them under the
    canonical `messages` / `prompt` names; all other fields pass through unchanged. `split` picks one split
    of a saved DatasetDict (optional when it has exactly one). Raises ValueError naming the file and line or
    row for a malformed row.
    """
    if prompt_key is None and messages_key is None:
        raise ValueError("load_rows needs prompt_key or messages_key; both are None")
    path = Path(path)
    if path.is_dir():
        raw_rows = _read_saved_dataset(path, split)
        where = [f"{path} row {index}" for index in range(len(raw_rows))]
    elif path.is_file() and path.suffix == ".jsonl":
        if split is not None:
            raise ValueError(f"split={split!r} only applies to a saved Hugging Face dataset, not {path}")
        line_numbers, raw_rows = _read_jsonl(path)
        where = [f"{path} row {index} (line {line})" for index, line in enumerate(line_numbers)]
    elif not path.exists():
        raise ValueError(f"data path {str(path)!r} does not exist")
    else:
        raise ValueError(
            f"data path {str(path)!r} is neither a .jsonl file nor a directory written by datasets' save_to_disk"
        )
    return canonical_rows(raw_rows, where, prompt_key, messages_key)


def canonical_rows(
    raw_rows: list[dict[str, Any]], where: list[str], prompt_key: str | None, messages_key: str | None
) -> list[dict[str, Any]]:
    """`raw_rows` checked and with the prompt under `messages` / `prompt`, as `load_rows` returns them; `where`
    names each row in errors (`<file> row 3 (line 4)`)."""
    return [_canonical_row(row, prompt_key, messages_key, place) for row, place in zip(raw_rows, where, strict=True)]


class MissingAnswerMarkerError(ValueError):
    """A row's answer does not hold the marker that should precede its final answer."""


def copy_answer_field(
    rows: list[dict[str, Any]], answer_key: str | None, where: list[str], marker: str | None = None
) -> list[dict[str, Any]]:
    """Each row with `answer` (the field the built-in rewards compare against) set from the field `answer_key`
    (dots reach into nested objects: `reward_model.ground_truth`; None = the row's own `answer`), cut to the text
    after `marker` when one is given (GSM8K's `####`: up to a second marker, stripped). The source field stays.
    ValueError naming the row (by `where`) when the field is missing or null, or the marker is not in it."""
    copied = []
    for row, place in zip(rows, where, strict=True):
        key = answer_key or "answer"
        answer = _field(row, key)
        # Arrow tables give every row every column, so a missing field reads as None there.
        if answer is None:
            raise ValueError(f"{place}: has no answer field {key!r}; keys found: {sorted(row)}")
        if marker is not None:
            text = str(answer)
            if marker not in text:
                raise MissingAnswerMarkerError(f"{place}: the answer {_shortened(text)!r} holds no {marker!r}")
            answer = text.split(marker)[1].strip()
        copied.append({**row, "answer": answer})
    return copied


def _field(row: dict[str, Any], key: str) -> Any:
    """`row[key]`, or for a dotted key that is not a field itself, the nested field it names (None if absent)."""
    if key in row or "." not in key:
        return row.get(key)
    node: Any = row
    for part in key.split("."):
        if not isinstance(node, dict) or part not in node:
            return None
        node = cast(dict[str, Any], node)[part]
    return node


def _shortened(text: str, limit: int = 60) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


def load_gym_rows(path: str | Path, split: str | None = None) -> list[dict[str, Any]]:
    """Gym rows (NeMo-Gym `/run` bodies) of a `.jsonl` file or a saved dataset, checked and otherwise unchanged.

    Each row needs `responses_create_params` with an `input` (a string or a non-empty list of items); task
    fields and `agent_ref` pass through. Raises ValueError naming the file and line or row of a bad row.
    """
    path = Path(path)
    if path.is_dir():
        raw_rows = _read_saved_dataset(path, split)
        where = [f"{path} row {index}" for index in range(len(raw_rows))]
    elif path.is_file() and path.suffix == ".jsonl":
        line_numbers, raw_rows = _read_jsonl(path)
        where = [f"{path} row {index} (line {line})" for index, line in enumerate(line_numbers)]
    else:
        raise ValueError(f"gym data path {str(path)!r} is neither a .jsonl file nor a save_to_disk directory")
    return check_gym_rows(raw_rows, where)


def check_gym_rows(raw_rows: list[dict[str, Any]], where: list[str]) -> list[dict[str, Any]]:
    """`raw_rows`, unchanged, after checking each is a gym row (see `load_gym_rows`); `where` names each row."""
    for row, place in zip(raw_rows, where, strict=True):
        params = row.get("responses_create_params")
        if not isinstance(params, dict):
            raise ValueError(f"{place}: a gym row needs a `responses_create_params` object; keys found: {sorted(row)}")
        given = params.get("input")
        if not (isinstance(given, str) and given) and not (isinstance(given, list) and given):
            raise ValueError(
                f"{place}: responses_create_params.input must be a non-empty string or list of items, got {given!r:.80}"
            )
    return raw_rows


def _read_jsonl(path: Path) -> tuple[list[int], list[dict[str, Any]]]:
    """(1-based line numbers, objects) of the non-blank lines of a JSONL file."""
    line_numbers, rows = [], []
    with path.open("rb") as file:
        for line_number, raw_line in enumerate(file, start=1):
            try:
                line = raw_line.decode("utf-8")
            except UnicodeDecodeError as error:
                raise ValueError(f"{path} line {line_number}: not UTF-8 text ({error.reason})") from None
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as error:
                raise ValueError(
                    f"{path} line {line_number}: invalid JSON ({error.msg} at column {error.colno})"
                ) from error
            if not isinstance(row, dict):
                raise ValueError(f"{path} line {line_number}: expected a JSON object, got {type(row).__name__}")
            line_numbers.append(line_number)
            rows.append(row)
    return line_numbers, rows


def _read_saved_dataset(path: Path, split: str | None) -> list[dict[str, Any]]:
    # Imported here: only directory datasets need it, and it adds ~0.5 s to every process that imports data/.
    import datasets

    try:
        loaded = datasets.load_from_disk(str(path))
    except FileNotFoundError as error:
        raise ValueError(f"{path} is a directory but not a dataset written by save_to_disk: {error}") from error
    if isinstance(loaded, datasets.DatasetDict):
        names = sorted(str(name) for name in loaded)
        chosen = names[0] if split is None and len(names) == 1 else split
        if chosen not in names:
            raise ValueError(f"{path} holds the splits {names}; pass split= one of them (got {split!r})")
        loaded = loaded[chosen]
    elif split is not None:
        raise ValueError(f"{path} is a single dataset without splits; split={split!r} does not apply")
    return loaded.to_list()


def _canonical_row(row: dict[str, Any], prompt_key: str | None, messages_key: str | None, where: str) -> dict[str, Any]:
    # Arrow tables give every row every column, so a missing field reads as None: treat None as absent.
    messages = row.get(messages_key) if messages_key is not None else None
    prompt = row.get(prompt_key) if prompt_key is not None else None
    if messages is None and prompt is None:
        wanted = tuple(key for key in (messages_key, prompt_key) if key is not None)
        raise MissingPromptFieldError(where, wanted, sorted(row))
    canonical = {key: value for key, value in row.items() if key not in (prompt_key, messages_key)}
    for name, key, value in ((PROMPT_KEY, prompt_key, prompt), (MESSAGES_KEY, messages_key, messages)):
        if value is None:
            continue
        if name in canonical:
            raise ValueError(f"{where}: field {key!r} would be renamed to {name!r}, which the row already has")
        canonical[name] = value
    if messages is not None:
        _check_messages(messages, f"{where} field {messages_key!r}")
    elif not isinstance(prompt, str):
        raise ValueError(f"{where}: field {prompt_key!r} must be a string, got {type(prompt).__name__}")
    return canonical


def _check_messages(messages: Any, where: str) -> None:
    if not isinstance(messages, list) or not messages:
        raise ValueError(f"{where}: must be a non-empty list of {{role, content}} messages, got {messages!r:.80}")
    for index, message in enumerate(messages):
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise ValueError(f"{where}[{index}]: expected an object with a string 'role', got {message!r:.80}")
        # None is allowed: an assistant message that only calls tools has no content.
        if not isinstance(message.get("content"), str | list | None):
            raise ValueError(f"{where}[{index}]: 'content' must be a string, a list of parts or null")


def prompt_messages(row: dict[str, Any], system_prompt: str | None = None) -> list[dict[str, Any]]:
    """The conversation to generate from: the row's `messages`, else [system?, user: `prompt`].

    `system_prompt` only applies to plain-text prompts; a message list is used exactly as given.
    """
    if row.get(MESSAGES_KEY) is not None:
        return list(row[MESSAGES_KEY])
    messages: list[dict[str, Any]] = [{"role": "system", "content": system_prompt}] if system_prompt else []
    return [*messages, {"role": "user", "content": row[PROMPT_KEY]}]


def split_rows(
    rows: list[dict[str, Any]], validation_fraction: float, seed: int
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(train, validation): round(len(rows) * validation_fraction) rows picked by `seed` go to validation.

    Deterministic for the same rows, fraction and seed; both parts keep the rows' original order.
    """
    if not 0.0 <= validation_fraction < 1.0:
        raise ValueError(f"validation_fraction must be in [0, 1), got {validation_fraction}")
    num_validation = round(len(rows) * validation_fraction)
    if num_validation == len(rows) and rows:
        raise ValueError(f"validation_fraction {validation_fraction} leaves no training rows out of {len(rows)}")
    picked = set(random.Random(seed).sample(range(len(rows)), num_validation))
    train = [row for index, row in enumerate(rows) if index not in picked]
    validation = [row for index, row in enumerate(rows) if index in picked]
    return train, validation
