"""Checks that a path is a local Hugging Face model directory before anything is loaded from it.

Called by the policy, value model and tokenizer loaders so a wrong path fails with one clear message instead
of a hub lookup error.
"""

from pathlib import Path


def require_model_directory(path: str | Path) -> Path:
    """`path` as a Path; ValueError unless it is a directory holding a config.json."""
    directory = Path(path)
    if not (directory / "config.json").is_file():
        problem = "does not exist" if not directory.exists() else "has no config.json"
        raise ValueError(
            f"model path {str(directory)!r} {problem}: expected a local Hugging Face model directory with "
            "config.json (as written by save_pretrained); hub names are not resolved"
        )
    return directory
