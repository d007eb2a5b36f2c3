"""NeMo-RL's data layout (`data.train` / `data.validation` merged over `data.default`) onto asyncppo's data keys:
registry names become the Hub id, split and row fields NeMo-RL's dataset classes read, local files become paths,
and what asyncppo's one-source, one-template data section cannot express is refused naming it."""

from pathlib import Path
from typing import Any

import pytest

from asyncppo.config import validate_tree
from asyncppo.config.nemo_rl import load_nemo_rl_tree, port_tree
from asyncppo.config.nemo_rl.port import PortResult

DATA = Path(__file__).parents[1] / "data" / "nemo_rl"
GRPO = DATA / "examples" / "configs" / "grpo_math_1B.yaml"
GYM = DATA / "examples" / "nemo_gym" / "grpo_workplace_assistant_nemotron_nano_v2_9b.yaml"
DATA_KEYS = {"max_input_seq_length", "shuffle"}  # set by other rows of grpo_math_1B's data section


def _port(data: dict[str, Any], path: Path = GRPO) -> PortResult:
    """grpo_math_1B (or `path`) with its data section's entries replaced by `data`."""
    source = load_nemo_rl_tree(path)
    source["data"] = {"max_input_seq_length": 256, "shuffle": True, **data}
    return port_tree(source)


def _data(result: PortResult) -> dict[str, Any]:
    assert result.refusals == []
    validate_tree(result.tree)
    return {key: value for key, value in result.tree["data"].items() if key not in DATA_KEYS}


def _refusal(result: PortResult) -> str:
    assert len(result.refusals) == 1, result.refusals
    return result.refusals[0]


MATH_DEFAULT = {
    "prompt_file": None,
    "system_prompt_file": None,
    "processor": "math_hf_data_processor",
    "env_name": "math",
}


def test_openmathinstruct2_with_a_held_out_share_reads_nvidias_hub_dataset() -> None:
    # grpo_math_1B as written: OpenMathInstruct-2, 5% held out, the chain-of-thought prompt template.
    result = port_tree(load_nemo_rl_tree(GRPO))
    assert _data(result) == {
        "dataset": "nvidia/OpenMathInstruct-2",
        "split": "train_1M",
        "prompt_key": "problem",
        "answer_key": "expected_answer",
        "validation_fraction": 0.05,
        "prompt_file": "examples/prompts/cot.txt",
    }
    rows = {row.key: row for row in result.rows}
    assert rows["data.train.seed"].action == "backend"  # asyncppo draws the held-out rows with ppo.seed
    assert rows["data.validation"].action == "neutral"
    assert result.tree["env"]["reward_function"] == "math"


def test_openmathinstruct2_holds_out_five_percent_unless_told_otherwise() -> None:
    data = _data(_port({"train": {"dataset_name": "OpenMathInstruct-2", "split": "train_2M"}, "default": MATH_DEFAULT}))
    assert (data["split"], data["validation_fraction"]) == ("train_2M", 0.05)
    result = _port(
        {
            "train": {"dataset_name": "OpenMathInstruct-2"},
            "validation": {
                "dataset_name": "ResponseDataset",
                "data_path": "v.jsonl",
                "input_key": "problem",
                "output_key": "expected_answer",
            },
            "default": MATH_DEFAULT,
        }
    )
    assert "asyncppo has no second validation source" in _refusal(result)


def test_dapo_rows_are_chat_messages_with_the_answer_inside_reward_model() -> None:
    data = _data(
        _port(
            {
                "train": {"dataset_name": "DAPOMath17K"},
                "validation": {"dataset_name": "DAPOMathAIME2024"},
                "default": MATH_DEFAULT,
            }
        )
    )
    assert data == {
        "dataset": "BytedTsinghua-SIA/DAPO-Math-17k",
        "split": "train",
        "messages_key": "prompt",
        "answer_key": "reward_model.ground_truth",
        "validation_dataset": "BytedTsinghua-SIA/AIME-2024",
        "validation_split": "train",
    }
    # asyncppo templates plain-text prompts only: a template over DAPO's chat rows is refused.
    refusal = _refusal(
        _port({"train": {"dataset_name": "DAPOMath17K"}, "default": {**MATH_DEFAULT, "prompt_file": "cot.txt"}})
    )
    assert refusal.startswith("data.default.prompt_file: refused: 'cot.txt': asyncppo has no prompt template over")


def test_gsm8k_answers_are_cut_at_the_marker_unless_extraction_is_off() -> None:
    entries = {
        "train": {"dataset_name": "gsm8k", "split": "train"},
        "validation": {"dataset_name": "gsm8k", "split": "test"},
    }
    default = {**MATH_DEFAULT, "system_prompt_file": "examples/prompts/gsm8k.txt"}
    expected = {
        "dataset": "openai/gsm8k",
        "dataset_config": "main",
        "split": "train",
        "prompt_key": "question",
        "answer_key": "answer",
        "answer_marker": "####",
        "validation_dataset": "openai/gsm8k",
        "validation_dataset_config": "main",
        "validation_split": "test",
        "system_prompt_file": "examples/prompts/gsm8k.txt",
    }
    assert _data(_port({**entries, "default": default})) == expected
    plain = {"dataset_name": "gsm8k", "extract_answer": False}
    data = _data(
        _port({"train": {**plain, "split": "train"}, "validation": {**plain, "split": "test"}, "default": default})
    )
    assert data == {key: value for key, value in expected.items() if key != "answer_marker"}
    # Train rows cut at the marker and validation rows as written would be graded differently: refused.
    mixed = _port({"train": entries["train"], "validation": {**plain, "split": "test"}, "default": default})
    (refusal,) = mixed.refusals
    assert refusal.startswith("data.validation.dataset_name: refused: 'gsm8k': asyncppo has no per-source row fields")


def test_a_response_dataset_reads_a_local_file_or_a_hub_dataset_with_its_fields() -> None:
    local = {"dataset_name": "ResponseDataset", "data_path": "rows/train.jsonl", "input_key": "q", "output_key": "a"}
    data = _data(
        _port({"train": local, "validation": {**local, "data_path": "rows/val.jsonl"}, "default": MATH_DEFAULT})
    )
    assert data == {
        "train_path": "rows/train.jsonl",
        "prompt_key": "q",
        "answer_key": "a",
        "validation_path": "rows/val.jsonl",
    }
    hub = {"dataset_name": "ResponseDataset", "data_path": "owner/rows", "subset": "easy", "split": "dev"}
    data = _data(_port({"train": hub, "default": MATH_DEFAULT}))
    assert data == {
        "dataset": "owner/rows",
        "dataset_config": "easy",
        "split": "dev",
        "prompt_key": "input",
        "answer_key": "output",
    }
    parquet = {**local, "data_path": "rows/train.parquet"}
    assert "not this file type" in _refusal(_port({"train": parquet, "default": MATH_DEFAULT}))


def test_gym_datasets_are_files_of_gym_rows() -> None:
    result = port_tree(load_nemo_rl_tree(GYM))
    assert _data(result) == {
        "train_path": "3rdparty/Gym-workspace/Gym/data/workplace_assistant/train.jsonl",
        "validation_path": "3rdparty/Gym-workspace/Gym/data/workplace_assistant/validation.jsonl",
    }
    rows = {row.key: row for row in result.rows}
    assert rows["data.default.dataset_name"].action == "mapped"  # the default fills both entries
    assert rows["data.default.processor"].action == rows["data.default.env_name"].action == "neutral"


@pytest.mark.parametrize(
    ("data", "key", "reason"),
    [
        (
            {"train": [{"dataset_name": "DAPOMath17K"}, {"dataset_name": "DeepScaler"}]},
            "data.train",
            "multiple training datasets",
        ),
        (
            {"train": {"dataset_name": "DAPOMath17K"}, "validation": [{"dataset_name": "AIME2024"}]},
            "data.validation",
            "multiple validation datasets",
        ),
        ({"train": {"dataset_name": "geometry3k"}}, "data.train.dataset_name", "no reader for this NeMo-RL dataset"),
        ({"train": {"dataset_name": "my_pkg.data.Rows"}}, "data.train.dataset_name", "a custom dataset class"),
        ({"train": {"dataset_name": "AIME2025"}}, "data.train.dataset_name", "reads one config"),
        (
            {"train": {"dataset_name": "DAPOMath17K"}, "validation": {"dataset_name": "AIME2024"}},
            "data.validation.dataset_name",
            "asyncppo has no per-source row fields",
        ),
        (
            {
                "train": {"dataset_name": "DeepScaler", "prompt_file": "a.txt"},
                "validation": {"dataset_name": "AIME2024"},
            },
            "data.validation.dataset_name",
            "rendered unlike the training rows: the training entry's prompt_file='a.txt'",
        ),
        (
            {
                "train": {"dataset_name": "DeepScaler", "prompt_file": "a.txt"},
                "validation": {"dataset_name": "AIME2024", "prompt_file": "b.txt"},
            },
            "data.validation.prompt_file",
            "prompt template for validation rows of its own",
        ),
        (
            {"train": {"dataset_name": "DeepScaler"}, "validation": {"dataset_name": "AIME2024", "env_name": "code"}},
            "data.validation.env_name",
            "separate validation environment",
        ),
        (
            {"train": {"dataset_name": "DeepScaler", "env_name": "reward_model"}},
            "data.train.env_name",
            "'reward_model' environment",
        ),
        (
            {"train": {"dataset_name": "ResponseDataset", "data_path": "r.jsonl", "split_validation_size": 100}},
            "data.train.split_validation_size",
            "held-out row count",
        ),
        ({"train": {"dataset_name": "AIME2024", "repeat": 4}}, "data.train.dataset_name", "no repeated dataset"),
        (
            {"train": {"dataset_name": "DeepScaler", "processor": "vlm_hf_data_processor"}},
            "data.train.processor",
            "row processor",
        ),
    ],
)
def test_what_one_data_section_cannot_express_is_refused_naming_it(data: dict[str, Any], key: str, reason: str) -> None:
    default = {"processor": "math_hf_data_processor", "env_name": "math"}
    refusal = _refusal(_port({**data, "default": default}))
    assert refusal.startswith(f"{key}: refused: ") and reason in refusal


def test_entry_keys_the_dataset_class_does_not_read_are_dropped_as_nemo_rl_drops_them() -> None:
    result = _port({"train": {"dataset_name": "DAPOMath17K", "split": "test", "seed": 3}, "default": MATH_DEFAULT})
    rows = {row.key: row for row in result.rows}
    assert rows["data.train.split"].action == rows["data.train.seed"].action == "neutral"
    assert _data(result)["split"] == "train"  # DAPO's one split


def test_the_older_flat_layout_reads_the_registry_and_the_file_paths() -> None:
    data = _data(port_tree(load_nemo_rl_tree(DATA / "ppo_math_1B.yaml")))
    assert (data["dataset"], data["messages_key"], data["validation_path"]) == (
        "BytedTsinghua-SIA/DAPO-Math-17k",
        "prompt",
        "data/aime24.jsonl",
    )
    data = _data(port_tree(load_nemo_rl_tree(DATA / "ppo_async_gym.yaml")))
    assert data == {"train_path": "/data/swe/train.jsonl", "validation_path": "/data/swe/validation.jsonl"}
