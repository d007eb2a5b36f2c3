"""Loads a tokenizer from a local model directory with exactly the splitting it was saved with, and the
tokenizer calls the strictly typed layers make, with their types pinned.

Called by everything that turns text into the token ids the policy trains on (generation, the policy
server, datasets). transformers leaves the `**kwargs` of `encode`, `decode` and `apply_chat_template` untyped,
which strict type checking rejects at every call; the typed wrappers below are called instead there.
"""

from collections.abc import Sequence
from pathlib import Path

from transformers import AutoTokenizer, PreTrainedTokenizerBase, PreTrainedTokenizerFast

from asyncppo.models.model_directory import require_model_directory


def load_tokenizer(path: str | Path) -> PreTrainedTokenizerBase:
    """The tokenizer saved in `path` (local files only).

    When the directory has a tokenizer.json we load it with PreTrainedTokenizerFast, which runs that file's
    pipeline verbatim. AutoTokenizer is not safe here: in transformers 5 it picks a class from the model
    type, and some classes (e.g. Qwen2Tokenizer for a `qwen2` config) rebuild the pre-tokenizer from their
    own rules and change the ids. Directories without tokenizer.json (sentencepiece-only) go through
    AutoTokenizer, which is the only loader that can convert them.
    """
    directory = require_model_directory(path)
    if (directory / "tokenizer.json").is_file():
        return PreTrainedTokenizerFast.from_pretrained(directory, local_files_only=True)
    return AutoTokenizer.from_pretrained(directory, local_files_only=True)


def encode_text(tokenizer: PreTrainedTokenizerBase, text: str, add_special_tokens: bool) -> list[int]:
    """The token ids of `text`."""
    return list(tokenizer.encode(text, add_special_tokens=add_special_tokens))


def decode_ids(tokenizer: PreTrainedTokenizerBase, token_ids: Sequence[int], skip_special_tokens: bool = False) -> str:
    """The text of `token_ids` (a flat list of ids decodes to one text)."""
    decoded = tokenizer.decode(list(token_ids), skip_special_tokens=skip_special_tokens)
    assert isinstance(decoded, str)
    return decoded


def render_chat_text(tokenizer: PreTrainedTokenizerBase, messages: list[dict[str, str]]) -> str:
    """`messages` rendered by the chat template as text (no generation prompt, not tokenized)."""
    rendered = tokenizer.apply_chat_template(messages, tokenize=False)
    if not isinstance(rendered, str):
        raise TypeError(f"apply_chat_template(tokenize=False) returned {type(rendered).__name__}, not text")
    return rendered
