"""Metric aliases: a step's metrics also under another framework's names, added where records go to the sinks.

`MetricsLogger(aliases=...)` calls `with_aliases` on every step before any sink sees it, so metrics.jsonl,
TensorBoard, W&B and MLflow all carry both names. `logger.metric_aliases: nemo_rl` picks `NEMO_RL_ALIASES`
(`trainer/run_metrics.py` builds the mapping for the run). An alias is listed only where both frameworks compute
the same number: same formula over the same tokens or samples, reduced the same way. README, "NeMo-RL metric
names", lists them with the reasons others are left out.
"""

from collections.abc import Mapping
from dataclasses import dataclass

NEMO_RL_COMMIT = "7ea279abfbeb698b092856d0dab61e7cf39bc909"
"""The NVIDIA-NeMo/RL commit whose metric names and formulas the table below was checked against."""


@dataclass(frozen=True)
class MetricAlias:
    """`source` (asyncppo's name) is also logged as `alias`."""

    source: str
    alias: str
    needs_one_global_batch: bool = False
    """NeMo-RL sums the per-global-batch means of its loss-function metrics over a step's global batches (the
    last PPO epoch's), where asyncppo averages them: the numbers agree only when a step is one global batch."""


NEMO_RL_ALIASES: tuple[MetricAlias, ...] = (
    # The loss function's train/inference mismatch, over the policy's tokens after sequence masking.
    MetricAlias("policy/token_mult_prob_error", "train/token_mult_prob_error", needs_one_global_batch=True),
    MetricAlias("policy/gen_kl_error", "train/gen_kl_error", needs_one_global_batch=True),
    MetricAlias("policy/policy_kl_error", "train/policy_kl_error", needs_one_global_batch=True),
    # Per-sequence mismatch over the whole step batch, and the sequence masking it drives.
    MetricAlias("mismatch/max_seq_mult_prob_error", "train/max_seq_mult_prob_error"),
    MetricAlias("mismatch/mean_seq_mult_prob_error", "train/mean_seq_mult_prob_error"),
    MetricAlias("mismatch/min_seq_mult_prob_error", "train/min_seq_mult_prob_error"),
    MetricAlias("mismatch/max_seq_mult_prob_error_after_mask", "train/max_seq_mult_prob_error_after_mask"),
    MetricAlias("mismatch/mean_seq_mult_prob_error_after_mask", "train/mean_seq_mult_prob_error_after_mask"),
    MetricAlias("mismatch/min_seq_mult_prob_error_after_mask", "train/min_seq_mult_prob_error_after_mask"),
    MetricAlias("mismatch/num_masked_seqs_by_logprob_error", "train/num_masked_seqs_by_logprob_error"),
    MetricAlias("mismatch/masked_correct_pct", "train/masked_correct_pct"),
    # The mean of the rewards the step trains on, and the mean validation reward.
    MetricAlias("train/processed_reward_mean", "train/reward"),
    MetricAlias("val/reward_mean", "validation/accuracy"),
    # Async: steps between the weights that generated each prompt group of the batch and the step training it.
    MetricAlias("async/avg_trajectory_age", "train/avg_trajectory_age"),
)


def nemo_rl_aliases(*, one_global_batch: bool) -> dict[str, str]:
    """Source name -> NeMo-RL name for a run; `one_global_batch`: every step is one policy optimizer step."""
    return {
        entry.source: entry.alias for entry in NEMO_RL_ALIASES if one_global_batch or not entry.needs_one_global_batch
    }


def with_aliases(metrics: Mapping[str, float], aliases: Mapping[str, str]) -> dict[str, float]:
    """`metrics` plus, for each source present, its value under the alias (a source the step lacks adds nothing).

    ValueError when an alias is itself one of the step's metrics: the alias would overwrite it.
    """
    aliased = dict(metrics)
    for source, alias in aliases.items():
        if source not in metrics:
            continue
        if alias in metrics:
            raise ValueError(f"metric alias {alias!r} (of {source!r}) is already a metric of the step")
        aliased[alias] = metrics[source]
    return aliased
