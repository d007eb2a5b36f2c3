"""Loads a tokenizer from a local model directory with exactly the splitting it was saved with.

Called by everything that turns text into the token ids the policy trains on (generation, the policy
server, datasets).
"""

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
