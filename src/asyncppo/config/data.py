"""The `data` config section: where the prompts come from and how rows are read.

Rows come from files (`train_path`, `validation_path`: JSONL or a `datasets` save_to_disk directory) or from a
Hugging Face Hub dataset (`dataset`, with its config, split and revision), read through `datasets` from the local
cache when it holds the dataset (so `HF_HUB_OFFLINE=1` works once it is cached).
"""

from typing import Self

from pydantic import Field, PositiveInt, model_validator

from asyncppo.config.base import RuleError, Section


class DataConfig(Section):
    """Training and validation prompts."""

    train_path: str | None = None
    """JSONL file or local Hugging Face `datasets` directory of training rows; exactly one of train_path and
    dataset is set."""
    validation_path: str | None = None
    """Validation rows (a file or directory as train_path); null = validation_dataset / validation_split when
    set, else validation_fraction of the training rows."""
    dataset: str | None = None
    """Hugging Face Hub dataset id of the training rows (`openai/gsm8k`); exactly one of train_path and dataset is
    set."""
    dataset_config: str | None = None
    """Config (subset) name of `dataset` (`main` for openai/gsm8k); null = the dataset's only or default config."""
    split: str = "train"
    """Split of `dataset` that holds the training rows."""
    revision: str | None = None
    """Git revision of `dataset` (a branch, tag or commit hash); null = the default branch."""
    validation_dataset: str | None = None
    """Hub dataset id of the validation rows; null = `dataset` (when validation_split is set)."""
    validation_dataset_config: str | None = None
    """Config of validation_dataset; null = dataset_config when the validation rows come from `dataset`, else
    the validation dataset's only or default config."""
    validation_split: str | None = None
    """Split holding the validation rows (of validation_dataset, else of dataset): `test` for openai/gsm8k."""
    validation_fraction: float = Field(default=0.0, ge=0, lt=1)
    """Share of training rows held out for validation when no validation source is set."""
    prompt_key: str = "prompt"
    """Row field holding a plain-text prompt (used when the row has no messages_key)."""
    messages_key: str = "messages"
    """Row field holding a chat message list."""
    answer_key: str | None = None
    """Row field copied to the row's `answer` (what the built-in rewards compare against), e.g. a dataset's
    `solution` column; a field inside a nested object is reached with dots (`reward_model.ground_truth`); null =
    rows already carry `answer` (or the reward reads other fields)."""
    answer_marker: str | None = None
    """Text that marks the final answer inside the answer (`####` in GSM8K's worked solutions): `answer` becomes
    the text after the marker's first occurrence (up to a second one), stripped; a row whose answer lacks the
    marker is an error naming the row. null = the answer as written."""
    system_prompt: str | None = None
    """System message prepended to plain-text prompts."""
    system_prompt_file: str | None = None
    """Text file whose whole content is the system message (relative paths: to the working directory); set at
    most one of system_prompt and system_prompt_file."""
    prompt_file: str | None = None
    """Text file holding a prompt template with one `{}` where the row's plain-text prompt goes (a chain-of-thought
    instruction, say); null = the prompt as is. Chat-message rows are not templated."""
    max_input_seq_length: PositiveInt | None = None
    """A rendered prompt longer than this many tokens is an error naming the row; null = the room left by
    model.max_total_sequence_length - generation.max_new_tokens."""
    shuffle: bool = True
    """Shuffle training rows each epoch (seeded by ppo.seed)."""
    max_new_tokens_key: str | None = None
    """Row field holding each row's response token budget: one int for every sample of the row, or a list of one
    int per sample (ppo.num_generations_per_prompt long for training rows, ppo.val_num_generations_per_prompt for
    validation rows). A sample generates at most min(its budget, generation.max_new_tokens) tokens; every row
    must have the field (a missing or malformed one is an error naming the row). The field stays in the row the
    reward function sees. Reward-function (single-turn) rollouts only: gym runs refuse it. null = every sample
    gets generation.max_new_tokens."""

    @model_validator(mode="after")
    def _one_source_each(self) -> Self:
        if (self.train_path is None) == (self.dataset is None):
            both = "both are set" if self.train_path is not None else "neither is set"
            raise RuleError("train_path", f"set exactly one of data.train_path and data.dataset; {both}")
        if self.answer_marker is not None and not self.answer_marker.strip():
            raise RuleError("answer_marker", f"{self.answer_marker!r} is blank; expected marker text such as '####'")
        if self.system_prompt is not None and self.system_prompt_file is not None:
            raise RuleError("system_prompt_file", "set at most one of data.system_prompt and data.system_prompt_file")
        validation_sources = [
            name
            for name, value in (
                ("validation_path", self.validation_path),
                ("validation_split", self.validation_split),
            )
            if value is not None
        ]
        if len(validation_sources) > 1:
            raise RuleError("validation_split", "set at most one of data.validation_path and data.validation_split")
        for name in ("validation_dataset", "validation_dataset_config"):
            if getattr(self, name) is not None and self.validation_split is None:
                raise RuleError(name, "needs data.validation_split (the split holding validation rows)")
        for name in ("dataset_config", "revision"):
            if getattr(self, name) is not None and self.dataset is None:
                raise RuleError(name, "applies to data.dataset, which is not set (rows come from data.train_path)")
        if self.validation_split is not None and self.validation_dataset is None and self.dataset is None:
            raise RuleError(
                "validation_split", "names a split of data.validation_dataset or data.dataset; neither is set"
            )
        return self

    @property
    def has_validation_source(self) -> bool:
        """Whether validation rows come from a file or a dataset split (rather than from validation_fraction)."""
        return self.validation_path is not None or self.validation_split is not None
