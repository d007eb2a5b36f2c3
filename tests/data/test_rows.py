"""load_rows (JSONL and save_to_disk directories), its error messages, prompt_messages and split_rows."""

import json
from pathlib import Path

import pytest

from asyncppo.data.rows import load_gym_rows, load_rows, prompt_messages, split_rows

CHAT = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi?"}]


def write_lines(path: Path, lines: list[str]) -> Path:
    path.write_text("".join(line + "\n" for line in lines))
    return path


def test_jsonl_rows_keep_task_fields_and_skip_blank_lines(tmp_path):
    path = write_lines(
        tmp_path / "train.jsonl",
        [json.dumps({"prompt": "What is 1+1?", "answer": "2"}), "", "   ", json.dumps({"messages": CHAT, "id": 7})],
    )
    assert load_rows(path) == [{"prompt": "What is 1+1?", "answer": "2"}, {"messages": CHAT, "id": 7}]


def test_configured_keys_are_renamed_to_the_canonical_names(tmp_path):
    path = write_lines(
        tmp_path / "rows.jsonl", [json.dumps({"question": "Q", "gold": "A"}), json.dumps({"chat": CHAT})]
    )
    rows = load_rows(path, prompt_key="question", messages_key="chat")
    assert rows == [{"prompt": "Q", "gold": "A"}, {"messages": CHAT}]


def test_a_bad_json_line_names_the_file_and_line(tmp_path):
    path = write_lines(tmp_path / "bad.jsonl", [json.dumps({"prompt": "ok"}), "", '{"prompt": "unterminated'])
    with pytest.raises(ValueError, match=r"bad\.jsonl line 3: invalid JSON"):
        load_rows(path)
    write_lines(path, ['["a", "list"]'])
    with pytest.raises(ValueError, match=r"bad\.jsonl line 1: expected a JSON object, got list"):
        load_rows(path)


def test_a_row_without_a_prompt_names_the_file_row_and_keys_found(tmp_path):
    path = write_lines(tmp_path / "rows.jsonl", [json.dumps({"prompt": "ok"}), "", json.dumps({"text": "x", "id": 1})])
    # Row 1 is on line 3: the blank line counts for lines, not for rows.
    with pytest.raises(
        ValueError, match=r"rows\.jsonl row 1 \(line 3\): has no prompt field .*keys found: \['id', 'text'\]"
    ):
        load_rows(path)


@pytest.mark.parametrize(
    ("row", "message"),
    [
        ({"prompt": 3}, "field 'prompt' must be a string, got int"),
        ({"messages": []}, "must be a non-empty list"),
        ({"messages": [{"content": "no role"}]}, r"\[0\]: expected an object with a string 'role'"),
        ({"messages": [{"role": "user", "content": 5}]}, r"\[0\]: 'content' must be a string"),
    ],
)
def test_malformed_prompt_fields_are_rejected(tmp_path, row, message):
    path = write_lines(tmp_path / "rows.jsonl", [json.dumps(row)])
    with pytest.raises(ValueError, match=message):
        load_rows(path)


def test_messages_take_precedence_and_a_disabled_key_is_ignored(tmp_path):
    path = write_lines(tmp_path / "rows.jsonl", [json.dumps({"prompt": "plain", "messages": CHAT})])
    (both,) = load_rows(path)
    assert prompt_messages(both) == CHAT
    (plain_only,) = load_rows(path, messages_key=None)
    assert plain_only == {"prompt": "plain", "messages": CHAT}  # "messages" stays as an ordinary task field
    with pytest.raises(ValueError, match="would be renamed to 'messages', which the row already has"):
        load_rows(path, messages_key="prompt", prompt_key=None)


def test_prompt_messages_wraps_plain_prompts_with_the_optional_system_prompt():
    assert prompt_messages({"prompt": "Q"}) == [{"role": "user", "content": "Q"}]
    assert prompt_messages({"prompt": "Q"}, system_prompt="S") == [
        {"role": "system", "content": "S"},
        {"role": "user", "content": "Q"},
    ]
    assert prompt_messages({"messages": CHAT}, system_prompt="ignored") == CHAT


def test_unsupported_and_missing_paths_are_rejected(tmp_path):
    with pytest.raises(ValueError, match="does not exist"):
        load_rows(tmp_path / "nope.jsonl")
    (tmp_path / "rows.csv").write_text("prompt\nx\n")
    with pytest.raises(ValueError, match=r"neither a \.jsonl file nor a directory"):
        load_rows(tmp_path / "rows.csv")
    with pytest.raises(ValueError, match="not a dataset written by save_to_disk"):
        load_rows(tmp_path)


def test_saved_hugging_face_datasets_load_like_jsonl(tmp_path):
    datasets = pytest.importorskip("datasets")
    # Arrow gives every row every column: the second row's missing prompt reads back as None and must not count.
    table = {"prompt": ["Q1", None], "messages": [None, CHAT], "answer": ["1", "2"]}
    datasets.Dataset.from_dict(table).save_to_disk(str(tmp_path / "single"))
    expected = [{"prompt": "Q1", "answer": "1"}, {"messages": CHAT, "answer": "2"}]
    assert load_rows(tmp_path / "single") == expected

    splits = datasets.DatasetDict(
        {"train": datasets.Dataset.from_dict(table), "test": datasets.Dataset.from_dict({"text": ["x"]})}
    )
    splits.save_to_disk(str(tmp_path / "splits"))
    assert load_rows(tmp_path / "splits", split="train") == expected
    with pytest.raises(ValueError, match=r"holds the splits \['test', 'train'\]"):
        load_rows(tmp_path / "splits")
    with pytest.raises(ValueError, match=r"splits row 0: has no prompt field .*keys found: \['text'\]"):
        load_rows(tmp_path / "splits", split="test")


def test_split_rows_is_deterministic_disjoint_and_keeps_order():
    rows = [{"prompt": str(index)} for index in range(50)]
    train, validation = split_rows(rows, 0.2, seed=3)
    assert (len(train), len(validation)) == (40, 10)
    assert split_rows(rows, 0.2, seed=3) == (train, validation)
    assert split_rows(rows, 0.2, seed=4)[1] != validation
    assert sorted(train + validation, key=lambda row: int(row["prompt"])) == rows
    for part in (train, validation):
        assert part == sorted(part, key=lambda row: int(row["prompt"]))
    assert split_rows(rows, 0.0, seed=3) == (rows, [])


@pytest.mark.parametrize("fraction", [-0.1, 1.0, 0.99])
def test_split_rows_rejects_fractions_that_leave_no_training_rows(fraction):
    with pytest.raises(ValueError, match="validation_fraction"):
        split_rows([{"prompt": "a"}, {"prompt": "b"}], fraction, seed=0)


def test_gym_rows_need_responses_create_params_with_an_input(tmp_path):
    good = {"responses_create_params": {"input": "2+2?"}, "expected_answer": "4", "agent_ref": {"name": "a"}}
    path = tmp_path / "gym.jsonl"
    path.write_text(json.dumps(good) + "\n\n" + json.dumps({"responses_create_params": {"input": []}}) + "\n")
    with pytest.raises(ValueError, match=r"gym.jsonl row 1 \(line 3\): responses_create_params.input must be"):
        load_gym_rows(path)
    path.write_text(json.dumps(good) + "\n" + json.dumps({"prompt": "2+2?"}) + "\n")
    with pytest.raises(ValueError, match=r"row 1 \(line 2\): a gym row needs a `responses_create_params` object"):
        load_gym_rows(path)
    path.write_text(json.dumps(good) + "\n")
    assert load_gym_rows(path) == [good]  # unchanged: task fields and agent_ref pass through
