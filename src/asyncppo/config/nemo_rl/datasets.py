"""NeMo-RL's dataset entries (`data.train`, `data.validation`, merged over `data.default`) as asyncppo data sources.

`data_source(entry)` says where one entry's rows come from (a local file or a Hugging Face Hub id with its config
and split) and which row fields hold the prompt and the reference answer, as NeMo-RL's dataset class of that
`dataset_name` reads them. NeMo-RL turns each row into a user message (the prompt) and an assistant message (the
reference answer, which its math environment grades against); asyncppo reads the same two fields through
`data.prompt_key` (plain text) or `data.messages_key` (a chat list) and `data.answer_key`. A registered name
whose rows asyncppo cannot read the same way is a DatasetRefused naming what is missing.
"""

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

LOCAL_SUFFIXES = (".jsonl",)
"""File types asyncppo reads as data.train_path / validation_path (besides `datasets` save_to_disk folders)."""


@dataclass(frozen=True)
class Columns:
    """The row fields of the prompt (plain text, or a chat message list) and of the reference answer."""

    prompt_key: str | None = None
    messages_key: str | None = None
    answer_key: str | None = None
    answer_marker: str | None = None
    """Text before the final answer inside the answer field (GSM8K's `####`), as data.answer_marker reads it."""

    @property
    def chat_rows(self) -> bool:
        """Whether the prompt is a chat message list (asyncppo neither templates it nor adds a system prompt)."""
        return self.messages_key is not None


@dataclass(frozen=True)
class DataSource:
    """Where one dataset entry's rows come from: a local `path`, or a Hub id with its config and split."""

    path: str | None
    hub_id: str | None
    config: str | None
    split: str | None
    columns: Columns
    held_out_fraction: float | None = None
    """The share NeMo-RL's class holds out for validation when the entry does not say (OpenMathInstruct-2: 0.05)."""
    gym_rows: bool = False


class DatasetRefused(ValueError):
    """An entry asyncppo cannot read as NeMo-RL does; the message names the dataset and what asyncppo lacks."""


@dataclass(frozen=True)
class RegisteredDataset:
    """A `dataset_name` of NeMo-RL's registry: the keyword arguments its class reads, and its rows as a source."""

    reads: frozenset[str]
    source: Callable[[dict[str, Any]], DataSource]


def _hub(hub_id: str, split: str, columns: Columns) -> Callable[[dict[str, Any]], DataSource]:
    return lambda _entry: DataSource(None, hub_id, None, split, columns)


# DAPO's rows hold the prompt as a one-message chat list and the answer inside `reward_model`.
_DAPO_COLUMNS = Columns(messages_key="prompt", answer_key="reward_model.ground_truth")
_PROBLEM_ANSWER = Columns(prompt_key="problem", answer_key="answer")
GSM8K_ANSWER_MARKER = "####"
_OPENMATH_SPLITS = ("train", "train_1M", "train_2M", "train_5M")


def _openmathinstruct2(entry: dict[str, Any]) -> DataSource:
    split = entry.get("split", "train_1M")
    if split not in _OPENMATH_SPLITS:
        raise DatasetRefused(f"OpenMathInstruct-2 split {split!r}: NeMo-RL reads only {list(_OPENMATH_SPLITS)}")
    columns = Columns(prompt_key="problem", answer_key=entry.get("output_key", "expected_answer"))
    return DataSource(None, "nvidia/OpenMathInstruct-2", None, split, columns, held_out_fraction=0.05)


def _gsm8k(entry: dict[str, Any]) -> DataSource:
    # NeMo-RL grades against the text after '####' of the worked solution unless extract_answer is false.
    marker = None if entry.get("extract_answer", True) is False else GSM8K_ANSWER_MARKER
    columns = Columns(prompt_key="question", answer_key="answer", answer_marker=marker)
    return DataSource(None, "openai/gsm8k", entry.get("subset") or "main", entry.get("split", "train"), columns)


def _aime(variant: str) -> Callable[[dict[str, Any]], DataSource]:
    def source(_entry: dict[str, Any]) -> DataSource:
        if variant == "2025":
            raise DatasetRefused(
                "AIME2025: NeMo-RL concatenates two configs of opencompass/AIME2025; asyncppo reads one config"
            )
        hub_id = {"2024": "HuggingFaceH4/aime_2024", "2026": "MathArena/aime_2026"}[variant]
        return DataSource(None, hub_id, None, "train", _PROBLEM_ANSWER)

    return source


def local_or_hub(path: str, subset: Any, split: Any, columns: Columns) -> DataSource:
    """A `data_path` as NeMo-RL's load_dataset_from_path reads it: a local file by its suffix, else a Hub id
    (`owner/name`), else a local `datasets` folder. A local file has one split, `train`."""
    if path.endswith(LOCAL_SUFFIXES):
        if split not in (None, "train") or subset is not None:
            raise DatasetRefused(f"{path}: a local file has no config or split other than train (got {split!r})")
        return DataSource(path, None, None, None, columns)
    if "." in path.rpartition("/")[2] and not path.endswith("/"):
        raise DatasetRefused(f"{path}: asyncppo reads JSONL files and `datasets` folders, not this file type")
    looks_like_hub_id = path.count("/") == 1 and not path.startswith((".", "/", "~"))
    if looks_like_hub_id:
        return DataSource(None, path, subset, split if split is not None else "train", columns)
    return DataSource(path, None, None, None, columns)


def _response_dataset(entry: dict[str, Any]) -> DataSource:
    path = entry.get("data_path")
    if not isinstance(path, str):
        raise DatasetRefused(f"ResponseDataset needs data_path (a file, folder or Hub id), got {path!r}")
    columns = Columns(prompt_key=entry.get("input_key", "input"), answer_key=entry.get("output_key", "output"))
    return local_or_hub(path, entry.get("subset"), entry.get("split"), columns)


def _nemo_gym_dataset(entry: dict[str, Any]) -> DataSource:
    path = entry.get("data_path")
    if not isinstance(path, str):
        raise DatasetRefused(f"NemoGymDataset needs data_path (a JSONL file of gym rows), got {path!r}")
    return DataSource(path, None, None, None, Columns(), gym_rows=True)


_NONE: frozenset[str] = frozenset()
REGISTRY: dict[str, RegisteredDataset] = {
    "OpenMathInstruct-2": RegisteredDataset(
        frozenset({"output_key", "split", "split_validation_size", "seed"}), _openmathinstruct2
    ),
    "DAPOMath17K": RegisteredDataset(_NONE, _hub("BytedTsinghua-SIA/DAPO-Math-17k", "train", _DAPO_COLUMNS)),
    "DAPOMathAIME2024": RegisteredDataset(_NONE, _hub("BytedTsinghua-SIA/AIME-2024", "train", _DAPO_COLUMNS)),
    "DeepScaler": RegisteredDataset(_NONE, _hub("agentica-org/DeepScaleR-Preview-Dataset", "train", _PROBLEM_ANSWER)),
    "AIME2024": RegisteredDataset(frozenset({"repeat"}), _aime("2024")),
    "AIME2025": RegisteredDataset(frozenset({"repeat"}), _aime("2025")),
    "AIME2026": RegisteredDataset(frozenset({"repeat"}), _aime("2026")),
    "gsm8k": RegisteredDataset(frozenset({"subset", "split", "extract_answer"}), _gsm8k),
    "GSM8K": RegisteredDataset(frozenset({"subset", "split", "extract_answer"}), _gsm8k),
    "ResponseDataset": RegisteredDataset(
        frozenset({"data_path", "input_key", "output_key", "subset", "split", "split_validation_size", "seed"}),
        _response_dataset,
    ),
    "NemoGymDataset": RegisteredDataset(frozenset({"data_path", "repeat"}), _nemo_gym_dataset),
}


def registered(name: Any) -> RegisteredDataset:
    """The registry entry of `name`; DatasetRefused for a name the port cannot read (naming it)."""
    if isinstance(name, str) and name in REGISTRY:
        return REGISTRY[name]
    if isinstance(name, str) and "." in name:
        raise DatasetRefused(f"{name}: a custom dataset class; asyncppo reads rows, not classes: export them as JSONL")
    raise DatasetRefused(
        f"{name!r}: asyncppo has no reader for this NeMo-RL dataset; the port reads {sorted(REGISTRY)}: "
        "export its rows as JSONL (data_path with dataset_name ResponseDataset)"
    )


def data_source(entry: dict[str, Any]) -> DataSource:
    """The rows of one dataset entry (already merged over data.default); DatasetRefused when asyncppo cannot
    read them as NeMo-RL does."""
    dataset = registered(entry.get("dataset_name"))
    repeat = entry.get("repeat", 1)
    if "repeat" in dataset.reads and repeat != 1:
        raise DatasetRefused(f"repeat={repeat!r}: asyncppo reads each row once per epoch (no repeated dataset)")
    return dataset.source(entry)
