"""The port end to end: NeMo-RL's ppo_math_1B.yaml (its mirror), ported and then overridden only where a CPU test
must differ (the tiny model, local arithmetic rows, small batches, the CPU), trains two steps in process, with the
ported algorithm settings (DAPO clip-higher and dual clip, reward scaling to [-1, 1], GAE) intact."""

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from asyncppo.config.loading import apply_overrides
from asyncppo.config.nemo_rl import checked_tree, port_file

MATH = Path(__file__).parents[1] / "data" / "nemo_rl" / "examples" / "configs" / "ppo_math_1B.yaml"


def _cpu_overrides(data_dir: Path) -> list[str]:
    """asyncppo overrides that turn the ported 1.5B GPU run into a seconds-long CPU run."""
    small_model = [
        f"{section}.{key}={value}"
        for section in ("model", "value")
        for key, value in (
            ("precision", "float32"),
            ("max_total_sequence_length", 128),
            ("train_global_batch_size", "null"),
            ("train_micro_batch_size", 8),
        )
    ]
    return [
        "model.model_name=tiny:tiny",
        "model.tokenizer=null",
        "model.logprob_batch_size=8",
        "value.model_name=null",
        *small_model,
        # The DAPO rows of the Hub swapped for local files of the same kind (a prompt and its answer).
        "data.dataset=null",
        "data.validation_dataset=null",
        "data.validation_split=null",
        "data.messages_key=messages",
        "data.answer_key=null",
        f"data.train_path={data_dir / 'train.jsonl'}",
        f"data.validation_path={data_dir / 'validation.jsonl'}",
        "data.max_input_seq_length=null",
        "env.reward_function=partial_credit:digit_fraction",
        "generation.max_new_tokens=6",
        "ppo.reward_shaping.max_response_length=6",
        "ppo.reward_shaping.overlong_buffer_length=2",
        "ppo.num_prompts_per_step=4",
        "ppo.num_generations_per_prompt=2",
        "ppo.max_num_steps=2",
        "ppo.ppo_epochs=1",
        "ppo.val_at_start=false",
        "ppo.val_period=2",
        "ppo.max_val_samples=4",
        "checkpointing.enabled=false",
        "logger.console=false",
        "cluster.device=cpu",
    ]


@pytest.mark.integration
@pytest.mark.slow
def test_the_ported_ppo_math_config_trains_two_steps_on_cpu(
    data_dir: Path,
    tmp_path: Path,
    train_in_process: Callable[[dict[str, Any], Path], list[dict[str, Any]]],
) -> None:
    ported = checked_tree(port_file(MATH))
    tree = apply_overrides(ported, _cpu_overrides(data_dir))
    # What the port carried over from NeMo-RL is what trains.
    assert tree["loss_fn"]["ratio_clip_max"] == 0.28 and tree["loss_fn"]["ratio_clip_c"] == 10
    assert tree["ppo"]["reward_scaling"]["target_min"] == -1.0 and tree["value_loss_fn"]["scale"] == 0.4
    metrics = train_in_process(tree, tmp_path / "run")
    steps = [record for record in metrics if "train/reward_mean" in record]
    assert [record["step"] for record in steps] == [1, 2]
    # The digit-fraction reward r in [0, 1] is scaled to 2r - 1 (NeMo-RL's [-1, 1]), then the overlong shaping
    # subtracts a penalty >= 0 from responses that reach the 6-token budget: processed mean <= 2 mean(r) - 1.
    for record in steps:
        assert record["train/processed_reward_mean"] <= 2 * record["train/reward_mean"] - 1 + 1e-6, record
    assert any("val/reward_mean" in record for record in metrics)
