"""Rows of one split of a Hugging Face Hub dataset, read with `datasets` from its cache (and downloaded into the
cache first when it is missing and the Hub may be reached). The pre-flight (trainer/preflight.py `load_data`)
reads the run's splits, `training_split` and `validation_split` of the `data` section, with `load_hub_split`.

    data.dataset / data.validation_dataset --HubSplit--> datasets.load_dataset --> DatasetDict (memory-mapped
        Arrow files in HF_DATASETS_CACHE) --[split]--> raw rows, each named `<dataset> split '<split>' row <i>`

Offline (HF_HUB_OFFLINE=1) `datasets` never asks the Hub: it reads the newest prepared copy of the dataset's
config in its cache, whatever revision is asked for. A pinned commit hash is checked against that copy (its
cache directory is named by the commit); a branch or tag cannot be checked without the Hub.
"""

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from asyncppo.config import ConfigError
from asyncppo.config.data import DataConfig

COMMIT_HASH = re.compile(r"[0-9a-f]{40}")


@dataclass(frozen=True)
class HubSplit:
    """One split of a Hub dataset: `dataset` (`openai/gsm8k`), its config (None = the only or default one), the
    split's name and the revision (a branch, tag or commit; None = the default branch); and the config keys each
    came from, for error lines."""

    dataset: str
    config_name: str | None
    split: str
    revision: str | None
    dataset_key: str = "data.dataset"
    config_key: str = "data.dataset_config"
    split_key: str = "data.split"


def training_split(data: DataConfig) -> HubSplit | None:
    """data.split of data.dataset (config data.dataset_config, at data.revision); None when rows come from
    data.train_path."""
    if data.dataset is None:
        return None
    return HubSplit(data.dataset, data.dataset_config, data.split, data.revision)


def validation_split(data: DataConfig) -> HubSplit | None:
    """data.validation_split of data.validation_dataset (at its default branch) or of data.dataset (at
    data.revision); its config is data.validation_dataset_config, else data.dataset_config for data.dataset's own
    split. None when validation rows come from elsewhere (validation_path or validation_fraction)."""
    if data.validation_split is None:
        return None
    dataset = data.validation_dataset or data.dataset
    assert dataset is not None, "the data section's rules require a dataset for data.validation_split"
    own = dataset == data.dataset
    config_key, config_name = "data.validation_dataset_config", data.validation_dataset_config
    if config_name is None and own:
        config_key, config_name = "data.dataset_config", data.dataset_config
    return HubSplit(
        dataset,
        config_name,
        data.validation_split,
        data.revision if own else None,
        dataset_key="data.dataset" if data.validation_dataset is None else "data.validation_dataset",
        config_key=config_key,
        split_key="data.validation_split",
    )


def load_hub_split(source: HubSplit) -> tuple[list[dict[str, Any]], list[str]]:
    """(rows as dicts, a name for each row used in errors) of `source`. A dataset neither cached nor downloadable,
    a config `datasets` refuses, a missing or empty split, or (offline) a cached commit other than the pinned one
    is a one-line ConfigError naming the key."""
    # Imported here: `datasets` adds ~0.5 s to every process, and only runs that read a Hub dataset need it.
    import datasets
    from datasets import config
    from datasets.exceptions import DatasetsError

    shown = repr(source.dataset) + (f" (config {source.config_name!r})" if source.config_name else "")
    offline = bool(config.HF_HUB_OFFLINE)  # what `datasets` read from HF_HUB_OFFLINE when it was imported
    try:
        loaded = datasets.load_dataset(source.dataset, source.config_name, revision=source.revision)
    except (ConnectionError, FileNotFoundError, DatasetsError) as error:
        problem = (
            f"is not in the datasets cache {config.HF_DATASETS_CACHE} and HF_HUB_OFFLINE=1 forbids downloading it"
            if offline
            else f"cannot be read or downloaded ({_one_line(error)})"
        )
        raise ConfigError(
            [
                f"{source.dataset_key}: Hub dataset {shown} {problem}; download it once online, or point HF_HOME / "
                "HF_DATASETS_CACHE at a cache that holds it"
            ]
        ) from None
    except ValueError as error:  # an unknown config, or several cached and none named
        raise ConfigError([f"{source.config_key}: Hub dataset {shown}: {_one_line(error, joined=True)}"]) from None
    assert isinstance(loaded, datasets.DatasetDict), "load_dataset without a split or streaming gives every split"
    splits = sorted(str(name) for name in loaded)
    if source.split not in splits:
        raise ConfigError(
            [f"{source.split_key}: Hub dataset {shown} has no split {source.split!r}; its splits are {splits}"]
        )
    split = loaded[source.split]
    if offline and source.revision is not None and COMMIT_HASH.fullmatch(source.revision):
        _check_cached_commit(split.cache_files, source.revision, shown)
    rows = split.to_list()
    if not rows:
        raise ConfigError([f"{source.split_key}: split {source.split!r} of Hub dataset {shown} holds no rows"])
    return rows, [f"{source.dataset} split {source.split!r} row {index}" for index in range(len(rows))]


def _check_cached_commit(cache_files: list[dict[str, str]], revision: str, shown: str) -> None:
    # A Hub dataset's prepared copy lives in <cache>/<org>___<name>/<config>/<version>/<commit hash>/.
    cached = sorted({Path(file["filename"]).parent.name for file in cache_files})
    if cached and revision not in cached:
        raise ConfigError(
            [
                f"data.revision: the datasets cache holds Hub dataset {shown} at commit {cached[0]}, not the pinned "
                f"{revision}, and offline `datasets` reads the newest cached copy; load the pinned commit once "
                "online, or unset data.revision"
            ]
        )


def _one_line(error: BaseException, joined: bool = False) -> str:
    """`error` as one line: its first line (download errors add hints), or all its lines joined by '; '."""
    lines = [line.strip() for line in str(error).strip().splitlines() if line.strip()]
    text = "; ".join(lines) if joined else (lines[0] if lines else "")
    return f"{type(error).__name__}: {text}" if text else type(error).__name__
