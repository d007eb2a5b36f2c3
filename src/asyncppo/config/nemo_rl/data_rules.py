"""The `data` section: NeMo-RL's dataset entries (`train`, `validation`, `default`) onto asyncppo's data keys.

    data.default --fills the keys an entry lacks--> data.train entry      --datasets.py--> data.dataset | train_path,
                                                    data.validation entry                  split, columns, prompts
                                                                                           data.validation_* ...

asyncppo reads one training source and one validation source with one set of row fields and one prompt template,
so an entry is mapped whole (`EntryPlan`: one outcome per entry key) and the validation entry must read its rows
the way the training entry does. A `data.default` key gets the outcome of every entry it fills, joined. The older
flat layout (`data.dataset_name`, `data.train_jsonl_fpath`, ...) is read as a training entry too.
"""

from typing import Any, cast

from asyncppo.config.nemo_rl.datasets import GSM8K_ANSWER_MARKER, Columns, DatasetRefused, DataSource, data_source
from asyncppo.config.nemo_rl.datasets import registered as registered_dataset
from asyncppo.config.nemo_rl.rules import Outcome, Rule, Source, backend, lacks, mapped, neutral, neutral_when

ENTRY_SECTIONS = ("data.train", "data.validation", "data.default")
MATH_PROCESSORS = ("math_hf_data_processor", "default")
GYM_PROCESSOR = "nemo_gym_data_processor"
LEGACY_ENTRY_KEYS = ("dataset_name", "prompt_file", "system_prompt_file")
"""Entry keys the older layout writes directly under `data`."""
RENDERING_KEYS = ("prompt_file", "system_prompt_file", "env_name")
"""Entry keys that decide how rows are rendered and scored: asyncppo has one setting of each for both splits."""
CLASS_KEYS = frozenset(
    {
        "data_path",
        "split",
        "subset",
        "input_key",
        "output_key",
        "repeat",
        "extract_answer",
        "split_validation_size",
        "seed",
    }
)
"""Entry keys a dataset class reads (each reads some of them; NeMo-RL ignores the others, with a warning)."""
_TARGETS = {
    "train": {"path": "data.train_path", "hub": "data.dataset", "config": "data.dataset_config", "split": "data.split"},
    "validation": {
        "path": "data.validation_path",
        "hub": "data.validation_dataset",
        "config": "data.validation_dataset_config",
        "split": "data.validation_split",
    },
}


def _entry(source: Source, section: str) -> dict[str, Any] | None:
    """The entry at `section` merged over data.default (None when the section is not one mapping)."""
    value = source.get(section)
    if not isinstance(value, dict):
        return None
    default = source.get("data.default")
    base = cast(dict[str, Any], default) if isinstance(default, dict) else {}
    return {**base, **cast(dict[str, Any], value)}


def _training_entry(source: Source) -> dict[str, Any] | None:
    if source.has("data.train"):
        return _entry(source, "data.train")
    legacy = {name: source.get(f"data.{name}") for name in LEGACY_ENTRY_KEYS if source.has(f"data.{name}")}
    return {name: value for name, value in legacy.items() if name != "dataset_name" or value is not None}


class EntryPlan:
    """The outcome of each key of one merged entry (`role`: train or validation)."""

    def __init__(self, entry: dict[str, Any], role: str, source: Source, training: "EntryPlan | None" = None):
        self.entry, self.role, self.source, self.training = entry, role, source, training
        self.error: str | None = None
        self.rows: DataSource | None = None
        try:
            self.rows = data_source(entry)
        except DatasetRefused as refusal:
            self.error = str(refusal)

    @property
    def columns(self) -> Columns | None:
        return self.rows.columns if self.rows is not None else None

    def outcome(self, name: str) -> Outcome:
        """What the port does with this entry's key `name`."""
        value = self.entry.get(name)
        if name == "dataset_name":
            return self._identity()
        if name in CLASS_KEYS:
            if self.error is not None:
                return Outcome("backend", f"part of the {self.role} dataset entry, refused at its dataset_name")
            if name not in registered_dataset(self.entry.get("dataset_name")).reads:
                return Outcome("neutral", f"not read by NeMo-RL's {self.entry.get('dataset_name')} dataset class")
        handler = getattr(self, f"_{name}", None)
        if handler is not None:
            return handler(value)
        return Outcome(
            "refused", f"{value!r}: {lacks(f'dataset entry key {name!r} (NeMo-RL does not read it either)')}"
        )

    def _identity(self) -> Outcome:
        """The dataset_name row: where the entry's rows come from and (training) which fields they are read by."""
        name = self.entry.get("dataset_name")
        if self.rows is None:
            return Outcome("refused", f"{name!r}: {self.error}")
        problem = self._training_problem(self.rows) if self.training is None else self._validation_problem(self.rows)
        if problem:
            return Outcome("refused", f"{name!r}: {problem}")
        targets, rows = _TARGETS[self.role], self.rows
        assignments: dict[str, Any] = (
            {targets["path"]: rows.path}
            if rows.path is not None
            else {targets["hub"]: rows.hub_id, targets["config"]: rows.config, targets["split"]: rows.split}
        )
        if self.training is None:
            fields = {"prompt_key": rows.columns.prompt_key, "messages_key": rows.columns.messages_key}
            fields["answer_key"] = rows.columns.answer_key
            fields["answer_marker"] = rows.columns.answer_marker
            assignments.update({f"data.{field}": value for field, value in fields.items()})
            if rows.held_out_fraction is not None and "split_validation_size" not in self.entry:
                assignments["data.validation_fraction"] = rows.held_out_fraction
        kept = {key: value for key, value in assignments.items() if value is not None}
        shown = ", ".join(f"{key}={value}" for key, value in kept.items())
        return Outcome("mapped", f"{shown} (NeMo-RL's {name})", kept)

    def _training_problem(self, rows: DataSource) -> str:
        """Why asyncppo cannot read this training entry as NeMo-RL does ('' when it can)."""
        implied_hold_out = rows.held_out_fraction is not None and "split_validation_size" not in self.entry
        if implied_hold_out and self.source.get("data.validation") is not None:
            return (
                f"{lacks('second validation source')}: NeMo-RL holds out {rows.held_out_fraction} of these rows by "
                "default and data.validation is set too"
            )
        return ""

    def _validation_problem(self, rows: DataSource) -> str:
        """Why asyncppo cannot read this validation entry beside the training one ('' when it can)."""
        assert self.training is not None
        if unset := self._unset_rendering():
            return f"{lacks('validation rows rendered unlike the training rows')}: {unset}"
        if self.training.columns not in (None, rows.columns):
            return (
                f"{lacks('per-source row fields')}: validation rows are read with {rows.columns}, training rows "
                f"with {self.training.columns}"
            )
        return ""

    def _unset_rendering(self) -> str:
        """The rendering keys the training entry sets and this (validation) entry leaves unset: NeMo-RL renders
        the validation rows without them, asyncppo renders both splits alike."""
        assert self.training is not None
        unset = [
            f"{name}={self.training.entry[name]!r}"
            for name in RENDERING_KEYS
            if name not in self.entry and self.training.entry.get(name) is not None
        ]
        return ", ".join(f"the training entry's {setting}" for setting in unset)

    def _data_path(self, value: Any) -> Outcome:
        assert self.rows is not None  # CLASS_KEYS are answered above while the entry is refused
        targets = _TARGETS[self.role]
        return mapped(targets["path"] if self.rows.path is not None else targets["hub"], value)

    def _split(self, value: Any) -> Outcome:
        assert self.rows is not None
        if self.rows.split is None:
            return Outcome("neutral", f"{value!r}: a local file's only split")
        return mapped(_TARGETS[self.role]["split"], value)

    def _subset(self, _value: Any) -> Outcome:
        assert self.rows is not None
        return mapped(_TARGETS[self.role]["config"], self.rows.config, "the Hub dataset's config")

    def _input_key(self, value: Any) -> Outcome:
        return self._column(value, "prompt_key")

    def _output_key(self, value: Any) -> Outcome:
        return self._column(value, "answer_key")

    def _column(self, value: Any, target: str) -> Outcome:
        if self.role == "validation":
            return Outcome("neutral", f"validation rows are read with the training rows' data.{target}")
        return mapped(f"data.{target}", value)

    def _split_validation_size(self, value: Any) -> Outcome:
        if self.role == "validation" or value in (None, 0):
            return Outcome("neutral", "no rows held out of this entry for validation")
        if self.source.get("data.validation") is not None:
            return Outcome("refused", f"{value!r}: {lacks('second validation source')} (data.validation is set too)")
        if not isinstance(value, int | float) or isinstance(value, bool) or value >= 1:
            return Outcome("refused", f"{value!r}: {lacks('held-out row count')}: expected a fraction below 1")
        return mapped("data.validation_fraction", value, "held out of the training rows")

    def _seed(self, _value: Any) -> Outcome:
        return Outcome("backend", "asyncppo draws the held-out rows with ppo.seed (data.validation_fraction)")

    def _repeat(self, value: Any) -> Outcome:
        if value == 1:
            return Outcome("neutral", "each row once, as asyncppo reads them")
        return Outcome("backend", "the repeated dataset, refused at dataset_name")

    def _extract_answer(self, value: Any) -> Outcome:
        if value is False:
            return Outcome("neutral", "the answer field as written, as asyncppo reads data.answer_key")
        if self.role == "validation":
            return Outcome("neutral", "validation rows are read with the training rows' data.answer_marker")
        return mapped("data.answer_marker", GSM8K_ANSWER_MARKER, "the text after it is the answer")

    def _prompt_file(self, value: Any) -> Outcome:
        return self._prompt_text(value, "prompt_file", "prompt template")

    def _system_prompt_file(self, value: Any) -> Outcome:
        return self._prompt_text(value, "system_prompt_file", "system prompt")

    def _prompt_text(self, value: Any, name: str, what: str) -> Outcome:
        if self.training is not None:  # validation: asyncppo renders both splits' prompts alike
            if value == self.training.entry.get(name):
                return Outcome("neutral", f"the training rows' {what} (data.{name})")
            return Outcome("refused", f"{value!r}: {lacks(f'{what} for validation rows of its own')}")
        if value is None:
            return Outcome("neutral", f"no {what} file: prompts are rendered as written")
        if self.rows is not None and (self.rows.gym_rows or self.rows.columns.chat_rows):
            kind = "gym rows" if self.rows.gym_rows else "chat-message rows"
            return Outcome("refused", f"{value!r}: {lacks(f'{what} over {kind}')} (it renders plain-text prompts)")
        return mapped(f"data.{name}", value)

    def _processor(self, value: Any) -> Outcome:
        gym = self.rows is not None and self.rows.gym_rows
        if value in MATH_PROCESSORS and not gym:
            return Outcome("neutral", "asyncppo renders rows as this processor does: system prompt, template, chat")
        if value == GYM_PROCESSOR and gym:
            return Outcome("neutral", "gym rows go to the agents as written")
        return Outcome("refused", f"{value!r}: {lacks(f'{value} row processor')} for these rows")

    def _env_name(self, value: Any) -> Outcome:
        if self.training is not None:
            if value == self.training.entry.get("env_name"):
                return Outcome("neutral", "the training rows' environment")
            return Outcome("refused", f"{value!r}: {lacks('separate validation environment')}")
        if value == "math":
            return mapped("env.reward_function", "math", "the math environment's grading")
        if value == "nemo_gym" and self.source.get("env.should_use_nemo_gym") is True:
            return Outcome("neutral", "rewards come from the NeMo-Gym servers (env.should_use_nemo_gym)")
        return Outcome("refused", f"{value!r}: {lacks(f'{value!r} environment')}")


def _plans(source: Source) -> tuple[EntryPlan | None, EntryPlan | None]:
    train_entry = _training_entry(source)
    training = EntryPlan(train_entry, "train", source) if train_entry else None
    validation_entry = _entry(source, "data.validation")
    validation = EntryPlan(validation_entry, "validation", source, training) if validation_entry else None
    return training, validation


def has_validation_rows(source: Source) -> bool:
    """Whether the ported run has validation rows: a validation file or entry, or rows held out of training."""
    if source.get("data.validation_jsonl_fpath") is not None:
        return True
    training, validation = _plans(source)
    if validation is not None:
        return True
    if training is None or training.error is not None:
        return False
    if "data.validation_fraction" in training.outcome("dataset_name").assignments:
        return True
    return training.outcome("split_validation_size").action == "mapped"


def _joined(outcomes: list[Outcome]) -> Outcome:
    if len(outcomes) == 1:
        return outcomes[0]
    for action in ("refused", "mapped", "backend", "neutral"):
        chosen = [outcome for outcome in outcomes if outcome.action == action]
        if chosen:
            assignments = {key: value for outcome in chosen for key, value in outcome.assignments.items()}
            return Outcome(action, "; ".join(dict.fromkeys(outcome.detail for outcome in chosen)), assignments)
    return Outcome("neutral", "")


def entry_key(key: str, value: Any, source: Source) -> Outcome:
    """A key inside data.train / data.validation / data.default, or an older-layout key of the training entry."""
    section, _, name = key.rpartition(".")
    if section == "data" and source.has("data.train"):
        return Outcome("neutral", "not read: NeMo-RL reads the entries under data.train")
    if section == "data" and name == "dataset_name" and value is None:
        return Outcome("neutral", "no named dataset (the data file paths are read)")
    if section not in ("data", *ENTRY_SECTIONS):
        return Outcome("refused", f"{value!r}: {lacks('nested dataset entry setting')} (entries hold plain values)")
    training, validation = _plans(source)
    if section == "data.train" or section == "data":
        assert training is not None
        return training.outcome(name)
    if section == "data.validation":
        assert validation is not None
        return validation.outcome(name)
    users = [
        plan
        for plan, entry_section in ((training, "data.train"), (validation, "data.validation"))
        if plan is not None and not source.has(f"{entry_section}.{name}")
    ]
    if not users:
        return Outcome("neutral", f"every dataset entry sets its own {name}")
    outcomes = [plan.outcome(name) for plan in users]
    # A validation outcome that only agrees with the training one (neutral, nothing set) adds nothing to the row.
    return _joined([outcomes[0], *(o for o in outcomes[1:] if o.action != "neutral")])


def _train_section(_key: str, value: Any, _source: Source) -> Outcome:
    if isinstance(value, list):
        return Outcome("refused", f"{len(cast(list[Any], value))} entries: {lacks('multiple training datasets')}")
    return Outcome("refused", f"{value!r}: expected a dataset entry (a mapping with dataset_name)")


def _validation_section(_key: str, value: Any, _source: Source) -> Outcome:
    if value is None:
        return Outcome("neutral", "no validation dataset entry")
    if isinstance(value, list):
        return Outcome("refused", f"{len(cast(list[Any], value))} entries: {lacks('multiple validation datasets')}")
    return Outcome("refused", f"{value!r}: expected a dataset entry (a mapping with dataset_name)")


_UNUSED_DATALOADERS = "read only with use_multiple_dataloader (refused there when on)"
DATA_RULES: list[tuple[str, Rule]] = [
    ("data.train", _train_section),
    ("data.validation", _validation_section),
    ("data.default", neutral("no defaults for the dataset entries")),
    *[(f"{section}.*", entry_key) for section in ENTRY_SECTIONS],
    *[(f"data.{name}", entry_key) for name in LEGACY_ENTRY_KEYS],
    ("data.train_jsonl_fpath", lambda _k, v, _s: mapped("data.train_path", v)),
    ("data.validation_jsonl_fpath", lambda _k, v, _s: mapped("data.validation_path", v)),
    ("data.num_workers", backend("DataLoader worker processes; asyncppo reads rows in its driver")),
    (
        "data.use_multiple_dataloader",
        neutral_when((False, None), "one dataloader over the training rows", lacks("multiple dataloaders")),
    ),
    ("data.num_prompts_per_dataloader", neutral(_UNUSED_DATALOADERS)),
    ("data.custom_dataloader", neutral(_UNUSED_DATALOADERS)),
    (
        "data.add_system_prompt",
        neutral_when((False, None), "no default system prompt", lacks("default system prompt")),
    ),
]
