"""Hub datasets (`data.dataset`, its config, split and revision; validation from `data.validation_split`) read
offline from the datasets cache by the pre-flight's `load_data`, `data.answer_key`, and one config error line,
naming the key, for each way a Hub split cannot be used."""

import json
from pathlib import Path

import datasets
import pytest

import hub_cache
from asyncppo.config import ConfigError, load_config
from asyncppo.trainer.preflight import load_data
from asyncppo.trainer.resume import refused_changes
from hub_cache import DATASET_CONFIG, DATASET_ID, HubCaches, gsm8k_rows

DEMO = Path(__file__).parents[2] / "examples" / "configs" / "demo.yaml"
HUB_DATA = ["data.train_path=null", "data.validation_path=null", "data.prompt_key=question"]
offline_hub = hub_cache.offline_hub  # the shared fixtures, registered in this module
hub_caches = hub_cache.hub_caches


def _load(*overrides: str):
    return load_data(load_config(DEMO, [*HUB_DATA, *overrides]))


def _error_lines(*overrides: str) -> list[str]:
    with pytest.raises(ConfigError) as raised:
        _load(*overrides)
    return raised.value.lines


def test_the_dataset_cache_has_the_layout_datasets_reads_offline(offline_hub: HubCaches):
    loaded = datasets.load_dataset(DATASET_ID, DATASET_CONFIG, split="test")
    assert loaded.to_list() == gsm8k_rows(4, 100)
    (cached,) = {Path(file["filename"]).parent for file in loaded.cache_files}
    assert cached == offline_hub.datasets / "org___tiny-math" / DATASET_CONFIG / "0.0.0" / offline_hub.dataset_commit


def test_training_and_validation_rows_come_from_the_dataset_splits(offline_hub: HubCaches):
    train, validation = _load(f"data.dataset={DATASET_ID}", "data.validation_split=test", "data.answer_key=answer")
    expected_train, expected_validation = gsm8k_rows(12, 0), gsm8k_rows(4, 100)
    # The prompt field is renamed to `prompt`, as for file rows; every other column passes through.
    assert train == [{"prompt": row["question"], "answer": row["answer"]} for row in expected_train]
    assert validation == [{"prompt": row["question"], "answer": row["answer"]} for row in expected_validation]


def test_without_a_validation_split_the_fraction_is_held_out_of_the_training_split(offline_hub: HubCaches):
    train, validation = _load(f"data.dataset={DATASET_ID}", "data.validation_fraction=0.25")
    # round(12 * 0.25) = 3 rows held out, the other 9 trained on.
    assert (len(train), len(validation)) == (9, 3)


def test_a_pinned_commit_is_checked_against_the_cached_copy(offline_hub: HubCaches):
    train, _ = _load(f"data.dataset={DATASET_ID}", f"data.revision={offline_hub.dataset_commit}")
    assert len(train) == 12
    other = "0" * 40
    assert _error_lines(f"data.dataset={DATASET_ID}", f"data.revision={other}") == [
        f"data.revision: the datasets cache holds Hub dataset {DATASET_ID!r} at commit {offline_hub.dataset_commit}, "
        f"not the pinned {other}, and offline `datasets` reads the newest cached copy; load the pinned commit once "
        "online, or unset data.revision"
    ]


def test_a_dataset_not_in_the_cache_offline_is_one_line_naming_data_dataset(offline_hub: HubCaches):
    assert _error_lines("data.dataset=org/missing") == [
        f"data.dataset: Hub dataset 'org/missing' is not in the datasets cache {offline_hub.datasets} and "
        "HF_HUB_OFFLINE=1 forbids downloading it; download it once online, or point HF_HOME / HF_DATASETS_CACHE at "
        "a cache that holds it"
    ]


def test_a_missing_validation_dataset_names_its_own_key(offline_hub: HubCaches):
    lines = _error_lines(
        f"data.dataset={DATASET_ID}", "data.validation_dataset=org/missing", "data.validation_split=test"
    )
    assert len(lines) == 1 and lines[0].startswith("data.validation_dataset: Hub dataset 'org/missing' is not in")


@pytest.mark.parametrize(
    ("overrides", "line"),
    [
        pytest.param(
            ["data.split=validation"],
            f"data.split: Hub dataset {DATASET_ID!r} has no split 'validation'; its splits are ['test', 'train']",
            id="split",
        ),
        pytest.param(
            ["data.validation_split=dev"],
            f"data.validation_split: Hub dataset {DATASET_ID!r} has no split 'dev'; its splits are ['test', 'train']",
            id="validation_split",
        ),
        pytest.param(
            ["data.dataset_config=socratic"],
            f"data.dataset_config: Hub dataset {DATASET_ID!r} (config 'socratic'): ValueError: Couldn't find cache "
            f"for {DATASET_ID} for config 'socratic'; Available configs in the cache: ['main']",
            id="config",
        ),
        pytest.param(
            ["data.prompt_key=problem"],
            f"data.prompt_key: {DATASET_ID} split 'train' row 0 has neither the prompt field 'problem' "
            "(data.prompt_key) nor the chat field 'messages' (data.messages_key), only ['answer', 'question']; set "
            "data.prompt_key or data.messages_key to the field that holds the prompt",
            id="prompt_field",
        ),
        pytest.param(
            ["data.answer_key=solution"],
            f"data.answer_key: {DATASET_ID} split 'train' row 0: has no answer field 'solution'; keys found: "
            "['answer', 'prompt']; set data.answer_key to a field every row has",
            id="answer_field",
        ),
    ],
)
def test_a_split_that_cannot_be_used_is_one_line_naming_its_key(offline_hub: HubCaches, overrides, line):
    assert _error_lines(f"data.dataset={DATASET_ID}", *overrides) == [line]


def test_the_answer_marker_leaves_gsm8k_final_number(offline_hub: HubCaches):
    train, validation = _load(
        f"data.dataset={DATASET_ID}", "data.validation_split=test", "data.answer_key=answer", "data.answer_marker=####"
    )
    expected = gsm8k_rows(12, 0) + gsm8k_rows(4, 100)
    assert [row["answer"] for row in train + validation] == [row["answer"].split("#### ")[1] for row in expected]
    assert train[0]["answer"] == "3"  # 2 apples + 1 more; the worked steps are gone


def test_a_dotted_answer_key_reads_a_nested_field_and_a_missing_marker_names_the_row(tmp_path: Path):
    # DAPO-Math's rows hold the answer inside a `reward_model` object.
    rows = [{"prompt": "What is 2+2?", "reward_model": {"ground_truth": "4", "style": "rule"}}]
    path = tmp_path / "rows.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    base = [f"data.train_path={path}", "data.validation_path=null", "data.answer_key=reward_model.ground_truth"]
    train, _ = load_data(load_config(DEMO, base))
    assert train[0]["answer"] == "4" and train[0]["reward_model"] == rows[0]["reward_model"]
    with pytest.raises(ConfigError) as raised:
        load_data(load_config(DEMO, [*base, "data.answer_marker=####"]))
    assert raised.value.lines == [
        f"data.answer_marker: {path} row 0: the answer '4' holds no '####'; set data.answer_marker to the text before "
        "every row's final answer"
    ]


def test_the_answer_key_copies_a_field_of_file_rows_too(tmp_path: Path):
    rows = [{"prompt": "What is 2+2?", "solution": "4"}, {"prompt": "What is 3+3?", "solution": "6"}]
    path = tmp_path / "rows.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    train, _ = load_data(
        load_config(DEMO, [f"data.train_path={path}", "data.validation_path=null", "data.answer_key=solution"])
    )
    assert [(row["answer"], row["solution"]) for row in train] == [("4", "4"), ("6", "6")]
    path.write_text(json.dumps({"prompt": "What is 2+2?"}) + "\n")
    with pytest.raises(ConfigError) as raised:
        load_data(
            load_config(DEMO, [f"data.train_path={path}", "data.validation_path=null", "data.answer_key=solution"])
        )
    assert raised.value.lines == [
        f"data.answer_key: {path} row 0: has no answer field 'solution'; keys found: ['prompt']; set data.answer_key "
        "to a field every row has"
    ]


@pytest.mark.parametrize(
    ("overrides", "line"),
    [
        pytest.param(
            ["data.dataset_config=main"],
            "data.dataset_config: applies to data.dataset, which is not set (rows come from data.train_path)",
            id="config_without_dataset",
        ),
        pytest.param(
            [*HUB_DATA, f"data.dataset={DATASET_ID}", "data.validation_dataset_config=main"],
            "data.validation_dataset_config: needs data.validation_split (the split holding validation rows)",
            id="validation_config_without_split",
        ),
    ],
)
def test_hub_keys_without_their_dataset_or_split_are_refused_at_load(overrides: list[str], line: str):
    with pytest.raises(ConfigError) as raised:
        load_config(DEMO, overrides)
    assert raised.value.lines == [line]


def test_a_resume_refuses_another_dataset_split_or_revision():
    old = {"data": {"dataset": DATASET_ID, "dataset_config": "main", "split": "train", "revision": None}}
    new = {"data": {"dataset": DATASET_ID, "dataset_config": "main", "split": "test", "revision": "v1"}}
    assert [line.split(":")[0] for line in refused_changes(old, new)] == ["data.split", "data.revision"]
