"""logger.metric_aliases: the run's real logger and sinks write each aliased metric also under NeMo-RL's name, in
metrics.jsonl and TensorBoard; the loss-function aliases only when a step is one global batch; the README table
lists exactly the aliases the code adds."""

import re
from pathlib import Path

import pytest

from asyncppo.config import load_config
from asyncppo.metrics import MetricsLogger, read_metrics_jsonl
from asyncppo.metrics.aliases import NEMO_RL_ALIASES, NEMO_RL_COMMIT, with_aliases
from asyncppo.trainer.run_metrics import metrics_logger

REPO = Path(__file__).parents[2]
DEMO = REPO / "examples" / "configs" / "demo.yaml"
# A step as the trainer logs it (async, with sequence masking on): every source of the table, and others.
STEP = {
    "policy/token_mult_prob_error": 1.08,
    "policy/gen_kl_error": 0.011,
    "policy/policy_kl_error": 0.012,
    "policy/js_divergence_error": 0.003,
    "mismatch/token_mult_prob_error": 1.07,
    "mismatch/max_seq_mult_prob_error": 1.4,
    "mismatch/mean_seq_mult_prob_error": 1.09,
    "mismatch/min_seq_mult_prob_error": 1.0,
    "mismatch/max_seq_mult_prob_error_after_mask": 1.3,
    "mismatch/mean_seq_mult_prob_error_after_mask": 1.08,
    "mismatch/min_seq_mult_prob_error_after_mask": 1.0,
    "mismatch/num_masked_seqs_by_logprob_error": 2.0,
    "mismatch/masked_correct_pct": 0.5,
    "train/reward_mean": 0.6,
    "train/processed_reward_mean": 0.55,
    "val/reward_mean": 0.7,
    "async/avg_trajectory_age": 1.0,
    "critic/explained_var": -0.1,
}
LOSS_FUNCTION_ALIASES = {"train/token_mult_prob_error", "train/gen_kl_error", "train/policy_kl_error"}


def _log_one_step(tmp_path: Path, *overrides: str) -> tuple[dict, set[str]]:
    """Log STEP at step 3 through the run's logger (metrics.jsonl + TensorBoard); the JSONL record and the
    TensorBoard scalar tags."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    config = load_config(DEMO, ["logger.console=false", "logger.tensorboard_enabled=true", *overrides])
    with metrics_logger(config, tmp_path, resume_step=0) as logger:
        logger.log(3, STEP)
    [record] = read_metrics_jsonl(tmp_path / "metrics.jsonl")
    events = EventAccumulator(str(tmp_path / "tensorboard"))
    events.Reload()
    return record, set(events.Tags()["scalars"])


def test_nemo_rl_names_are_written_to_jsonl_and_tensorboard_beside_ours(tmp_path: Path):
    # model.train_global_batch_size null: a step (32 prompts x 8 samples) is one global batch.
    record, tags = _log_one_step(tmp_path, "logger.metric_aliases=nemo_rl", "model.train_global_batch_size=null")
    expected = {entry.alias: STEP[entry.source] for entry in NEMO_RL_ALIASES}
    assert {key: record[key] for key in expected} == pytest.approx(expected)
    assert set(expected) <= tags
    # Our names stay; only the listed ones get a second name.
    assert {key: record[key] for key in STEP} == pytest.approx(STEP)
    assert set(record) == {"step", *STEP, *expected}


def test_loss_function_aliases_need_a_step_of_one_global_batch(tmp_path: Path):
    # The demo trains 256 samples per step in global batches of 64: NeMo-RL would sum 4 batch means.
    record, tags = _log_one_step(tmp_path, "logger.metric_aliases=nemo_rl")
    assert not LOSS_FUNCTION_ALIASES & (set(record) | tags)
    assert record["train/max_seq_mult_prob_error"] == 1.4 and record["validation/accuracy"] == 0.7
    assert "train/max_seq_mult_prob_error" in tags


def test_no_aliases_by_default(tmp_path: Path):
    record, tags = _log_one_step(tmp_path)
    assert set(record) == {"step", *STEP}
    assert not any(tag.startswith(("validation/", "train/max_seq")) for tag in tags)


def test_a_source_the_step_lacks_adds_nothing_and_an_alias_may_not_overwrite_a_metric():
    assert with_aliases({"val/reward_mean": 0.5}, {"train/processed_reward_mean": "train/reward"}) == {
        "val/reward_mean": 0.5
    }
    with pytest.raises(ValueError, match=r"'train/reward' .* is already a metric"):
        MetricsLogger([], aliases={"val/reward_mean": "train/reward"}).log(
            1, {"val/reward_mean": 1.0, "train/reward": 2.0}
        )


def test_the_readme_table_lists_every_alias_and_the_commit_read():
    readme = (REPO / "README.md").read_text()
    section = readme[readme.index("### NeMo-RL metric names") :]
    section = section[: section.index("\n#")]
    rows = set(re.findall(r"^\| `([^`]+)` \| `([^`]+)` \|", section, flags=re.MULTILINE))
    assert rows == {(entry.source, entry.alias) for entry in NEMO_RL_ALIASES}
    assert NEMO_RL_COMMIT[:12] in section
