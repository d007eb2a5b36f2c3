"""`asyncppo train` with a Hub model id and a Hub dataset, offline from the Hugging Face cache (HF_HUB_OFFLINE=1):
the demo config trains 2 short steps on `org/tiny` and the GSM8K-shaped `org/tiny-math`, its prompts built from the
dataset's questions, the prompt file and the system prompt file; a model or dataset missing from the cache stops
the command at its setup with one error line and exit status 2."""

import json
from pathlib import Path

import pytest

import hub_cache
from asyncppo.cli.main import main
from asyncppo.metrics import read_metrics_jsonl
from asyncppo.metrics.train_data import train_data_path
from hub_cache import DATASET_ID, MODEL_ID, HubCaches

REPO = Path(__file__).parents[2]
DEMO = str(REPO / "examples" / "configs" / "demo.yaml")
offline_hub = hub_cache.offline_hub  # the shared fixtures, registered in this module
hub_caches = hub_cache.hub_caches

HUB_INPUTS = [
    f"model.model_name={MODEL_ID}",
    "data.train_path=null",
    "data.validation_path=null",
    f"data.dataset={DATASET_ID}",
    "data.prompt_key=question",
    "data.answer_key=answer",
    "data.answer_marker=####",
    "data.validation_split=test",
    "env.reward_function=math",
]
# The demo shrunk to 2 steps of 4 prompts x 2 samples, 6 new tokens each, validated once on 2 rows at the start;
# the byte-level tiny tokenizer spends ~1 token per 2 characters, so the context is raised for the word problems.
SHORT_RUN = [
    "model.train_global_batch_size=8",
    "model.train_micro_batch_size=8",
    "value.train_global_batch_size=8",
    "value.train_micro_batch_size=8",
    "model.max_total_sequence_length=192",
    "value.max_total_sequence_length=192",
    "generation.max_new_tokens=6",
    "ppo.num_prompts_per_step=4",
    "ppo.num_generations_per_prompt=2",
    "ppo.max_num_steps=2",
    "ppo.ppo_epochs=1",
    "ppo.val_period=0",
    "ppo.val_at_end=false",
    "ppo.max_val_samples=2",
    "ppo.val_num_generations_per_prompt=1",
    "checkpointing.enabled=false",
    "logger.console=false",
]


def _train(run_dir: Path, *overrides: str) -> int:
    return main(["train", DEMO, "--run-dir", str(run_dir), *HUB_INPUTS, *SHORT_RUN, *overrides])


@pytest.mark.integration
@pytest.mark.slow
def test_the_demo_trains_on_a_hub_model_and_a_hub_dataset_offline(
    ray_cluster: None, offline_hub: HubCaches, tmp_path: Path
):
    template = tmp_path / "prompt.txt"
    template.write_text("Solve: {}")
    system = tmp_path / "system.txt"
    system.write_text("Be exact.")
    run_dir = tmp_path / "run"
    status = _train(run_dir, f"data.prompt_file={template}", f"data.system_prompt_file={system}")
    assert status == 0
    assert [record["step"] for record in read_metrics_jsonl(run_dir / "metrics.jsonl")][-2:] == [1, 2]
    trained = [json.loads(line) for line in train_data_path(run_dir, 1).read_text().splitlines()]
    questions = {row["question"] for row in hub_cache.gsm8k_rows(12, 0)}
    assert len(trained) == 8
    for record in trained:
        prompt = record["prompt"]
        assert "Be exact." in prompt and "Solve: " in prompt
        assert sum(question in prompt for question in questions) == 1


def _only_error(capsys: pytest.CaptureFixture[str], run_dir: Path, *overrides: str) -> str:
    status = _train(run_dir, *overrides)
    captured = capsys.readouterr()
    assert status == 2, captured.err
    errors = [line for line in captured.err.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1, captured.err
    assert "Traceback" not in captured.err
    return errors[0]


def test_a_model_not_in_the_cache_stops_train_with_one_line(
    offline_hub: HubCaches, tmp_path: Path, capsys: pytest.CaptureFixture[str]
):
    line = _only_error(capsys, tmp_path / "run", "model.model_name=org/missing", "model.revision=v3")
    assert line == (
        f"error: model.model_name: Hub model 'org/missing' at revision 'v3' is not in the Hugging Face cache "
        f"{offline_hub.hub} and HF_HUB_OFFLINE=1 forbids downloading it; download it once without HF_HUB_OFFLINE "
        "(e.g. `hf download <id>`), or point HF_HOME / HF_HUB_CACHE at a cache that holds it"
    )


def test_a_dataset_not_in_the_cache_stops_train_with_one_line(
    offline_hub: HubCaches, tmp_path: Path, capsys: pytest.CaptureFixture[str]
):
    line = _only_error(capsys, tmp_path / "run", "data.dataset=org/missing")
    assert line.startswith(
        f"error: data.dataset: Hub dataset 'org/missing' is not in the datasets cache {offline_hub.datasets} and "
        "HF_HUB_OFFLINE=1 forbids downloading it"
    )
