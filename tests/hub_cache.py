"""A Hugging Face cache on disk, laid out as huggingface_hub and datasets write it, for tests that load Hub model
ids and Hub datasets offline. Test modules register the fixtures by assigning them (`offline_hub =
hub_cache.offline_hub`), since a helper module's fixtures are not collected on their own.

    <home>/hub/models--org--tiny/refs/main              the main commit's hash (refs/v1: the first commit's)
                                /blobs/<hash>           each file's content once: sha256 for weights (LFS
                                                        files), the git blob sha1 for the rest
                                /snapshots/<commit>/<file> -> ../../blobs/<hash>
    <home>/datasets/org___tiny-math/main/0.0.0/<commit>/  dataset_info.json, tiny-math-{train,test}.arrow,
                                                        prepared by datasets' own Parquet builder

The model's main commit is the `tiny:tiny` preset; its first commit has the same tokenizer and other random
weights (seed 1), so a pinned revision is told apart by its weights. The dataset is GSM8K-shaped: `question`,
and an `answer` of worked steps ending in `#### N`.
"""

import hashlib
import os
import shutil
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from asyncppo.models.tiny import TINY, build_tiny_model, ensure_tiny

MODEL_ID = "org/tiny"
DATASET_ID = "org/tiny-math"
DATASET_CONFIG = "main"
FIRST_COMMIT_SPEC = replace(TINY, seed=1)
"""The weights of the model repository's first commit (its main commit holds TINY's)."""


@dataclass(frozen=True)
class HubCaches:
    """Where the caches lie (HF_HOME, and the hub and datasets caches under it) and the commits they hold."""

    home: Path
    first_commit: str
    main_commit: str
    dataset_commit: str

    @property
    def hub(self) -> Path:
        return self.home / "hub"

    @property
    def datasets(self) -> Path:
        return self.home / "datasets"


def _blob_name(relative: str, content: bytes) -> str:
    # The Hub names LFS files (weights) by their sha256 and plain git files by their git blob sha1.
    if relative.endswith(".safetensors"):
        return hashlib.sha256(content).hexdigest()
    return hashlib.sha1(b"blob %d\0" % len(content) + content).hexdigest()


def write_model_commit(hub: Path, repo_id: str, source: Path, refs: tuple[str, ...]) -> str:
    """Add the files of directory `source` to the cache as one commit of model `repo_id`, point `refs` (branch or
    tag names) at it, and return the commit hash (a sha1 of the commit's file listing, as git's is of its tree)."""
    repo = hub / f"models--{repo_id.replace('/', '--')}"
    files = sorted(path for path in source.rglob("*") if path.is_file())
    blobs = {path: _blob_name(path.relative_to(source).as_posix(), path.read_bytes()) for path in files}
    listing = "".join(f"{path.relative_to(source).as_posix()} {blob}\n" for path, blob in blobs.items())
    commit = hashlib.sha1(listing.encode()).hexdigest()
    for path, blob in blobs.items():
        target = repo / "blobs" / blob
        target.parent.mkdir(parents=True, exist_ok=True)
        if not target.exists():
            shutil.copyfile(path, target)
        link = repo / "snapshots" / commit / path.relative_to(source)
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(os.path.relpath(target, link.parent))
    for ref in refs:
        (repo / "refs").mkdir(parents=True, exist_ok=True)
        (repo / "refs" / ref).write_text(commit)  # huggingface_hub writes the bare hash, no newline
    return commit


def gsm8k_rows(count: int, start: int) -> list[dict[str, str]]:
    """GSM8K-shaped rows: a word problem and worked steps whose last line is `#### <answer>`."""
    rows = []
    for index in range(start, start + count):
        apples, more = index % 7 + 2, index % 5 + 1
        total = apples + more
        rows.append(
            {
                "question": f"Ada has {apples} apples and buys {more} more. How many apples does she have?",
                "answer": f"She has {apples} + {more} = <<{apples}+{more}={total}>>{total} apples.\n#### {total}",
            }
        )
    return rows


def write_dataset_cache(
    datasets_cache: Path, staging: Path, dataset_id: str, config_name: str, commit: str, splits: dict[str, Any]
) -> None:
    """Prepare `splits` ({name: rows}) as `datasets` does after downloading a Hub dataset's parquet files: its
    Parquet builder writes the Arrow files, into the directory `datasets` names after the repository (a builder
    given `repo_id`) and the commit (the builder's hash)."""
    from datasets.data_files import DataFilesDict
    from datasets.load import configure_builder_class
    from datasets.packaged_modules.parquet.parquet import Parquet, ParquetConfig

    name = dataset_id.split("/")[1]
    staging.mkdir(parents=True)
    for split, rows in splits.items():
        pq.write_table(pa.Table.from_pylist(rows), staging / f"{split}-00000-of-00001.parquet")
    patterns = {split: [f"{split}-*.parquet"] for split in splits}
    data_files = DataFilesDict.from_patterns(patterns, base_path=str(staging))

    def builder(config: ParquetConfig, cache_dir: Path, **hub: str) -> Any:
        configured = configure_builder_class(Parquet, [config], config_name, dataset_name=name)
        return configured(cache_dir=str(cache_dir), dataset_name=name, config_name=config_name, hash=commit, **hub)

    # A builder only accepts hf:// data files when it knows the repository, so the Hub one (no files) names the
    # directory and a local one (the staged files) fills it.
    target = builder(ParquetConfig(name=config_name), datasets_cache, repo_id=dataset_id).cache_dir
    local = builder(ParquetConfig(name=config_name, data_files=data_files), staging / "cache")
    local.download_and_prepare(output_dir=target)


def build_hub_caches(home: Path, tiny_dir: Path) -> HubCaches:
    """Both caches under `home`: the model (`tiny_dir` holds the TINY preset) and the dataset."""
    first = home.parent / "first-commit"
    build_tiny_model(FIRST_COMMIT_SPEC).save_pretrained(first)
    for tokenizer_file in tiny_dir.iterdir():
        if "token" in tokenizer_file.name or tokenizer_file.suffix == ".jinja":
            shutil.copyfile(tokenizer_file, first / tokenizer_file.name)
    first_commit = write_model_commit(home / "hub", MODEL_ID, first, refs=("v1",))
    main_commit = write_model_commit(home / "hub", MODEL_ID, tiny_dir, refs=("main",))
    dataset_commit = hashlib.sha1(DATASET_ID.encode()).hexdigest()
    splits = {"train": gsm8k_rows(12, 0), "test": gsm8k_rows(4, 100)}
    write_dataset_cache(home / "datasets", home.parent / "staging", DATASET_ID, DATASET_CONFIG, dataset_commit, splits)
    return HubCaches(home, first_commit, main_commit, dataset_commit)


@pytest.fixture(scope="session")
def hub_caches(tmp_path_factory: pytest.TempPathFactory, shared_cache_dir: Path) -> HubCaches:
    """The session's Hugging Face caches (built once per session; tests must not write into them)."""
    root = tmp_path_factory.mktemp("huggingface")
    return build_hub_caches(root / "home", ensure_tiny(shared_cache_dir / "models", "tiny"))


@pytest.fixture
def offline_hub(hub_caches: HubCaches, monkeypatch: pytest.MonkeyPatch) -> Iterator[HubCaches]:
    """The session's caches as this test's Hugging Face home, with HF_HUB_OFFLINE=1.

    The environment variables reach child processes; huggingface_hub and datasets read them once, when imported,
    so their module constants (what their functions consult at call time) are set too.
    """
    from datasets import config as datasets_config
    from huggingface_hub import constants

    settings = {
        "HF_HOME": str(hub_caches.home),
        "HF_HUB_CACHE": str(hub_caches.hub),
        "HF_DATASETS_CACHE": str(hub_caches.datasets),
        "HF_HUB_OFFLINE": "1",
    }
    for name, value in settings.items():
        monkeypatch.setenv(name, value)
    for module, names in (
        (constants, {"HF_HOME": str(hub_caches.home), "HF_HUB_CACHE": str(hub_caches.hub), "HF_HUB_OFFLINE": True}),
        (
            datasets_config,
            {
                "HF_CACHE_HOME": str(hub_caches.home),
                "HF_DATASETS_CACHE": hub_caches.datasets,
                "HF_HUB_OFFLINE": True,
                "HF_DATASETS_OFFLINE": True,
            },
        ),
    ):
        for name, value in names.items():
            monkeypatch.setattr(module, name, value)
    yield hub_caches
