"""The sections of the run report: which logged metrics each one plots, and how a section becomes HTML.

`metrics/report.py` calls `render_metric_sections` with the runs' JSONL records. A section lists panels of
metric keys (keys a run did not log are left out); a section may also give every other key under a prefix a
panel of its own. A section none of whose keys any run logged says so in one line instead of an empty plot.
"""

import html
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from asyncppo.metrics.report_plots import Curve, PanelData, figure_png_base64, stacked_timing_png_base64

Records = Sequence[Mapping[str, Any]]


MFU_KEYS = (
    "perf/policy_train_mfu",
    "perf/critic_train_mfu",
    "perf/logprobs_mfu",
    "perf/reference_logprobs_mfu",
    "perf/values_mfu",
    "perf/step_flops_utilization",
)
"""The model-FLOPs-utilisation metrics of a step (trainer/perf.py writes them), per phase then the whole step."""


@dataclass(frozen=True)
class Panel:
    """Keys drawn on one axes; a key ending in `*` stands for every logged key that starts with the rest.

    `band` maps a key to the key of its spread (mean +- std is shaded).
    """

    caption: str
    keys: tuple[str, ...]
    band: Mapping[str, str] = field(default_factory=dict[str, str])


@dataclass(frozen=True)
class Section:
    """A headed group of panels. `other_keys_under`: every key under this prefix not in a panel gets its own."""

    heading: str
    anchor: str
    about: str
    panels: tuple[Panel, ...]
    other_keys_under: str | None = None


SECTIONS = (
    Section(
        "Reward",
        "reward",
        "Mean training reward per step (shaded: +- its standard deviation over the step's samples).",
        (
            Panel("train/reward_mean", ("train/reward_mean",), {"train/reward_mean": "train/reward_std"}),
            Panel("train/processed_reward_mean", ("train/processed_reward_mean",)),
            Panel("response length", ("train/response_length_mean", "train/response_length_max")),
            Panel("train/truncated_frac", ("train/truncated_frac",)),
        ),
    ),
    Section(
        "Validation",
        "validation",
        "Held-out prompts, sampled with the validation settings every ppo.val_period steps.",
        (Panel("val/reward_mean", ("val/reward_mean",)), Panel("val/acc", ("val/acc",))),
        other_keys_under="val/",
    ),
    Section(
        "Critic",
        "critic",
        "Explained variance of the value model's predictions of the returns (1 is perfect, 0 predicts the mean; "
        "a fresh critic starts negative: see docs/critic.md) and the value loss.",
        (
            Panel("explained variance", ("critic/explained_var", "critic/explained_var_last_pass", "critic/ev_res")),
            Panel("critic/loss (value loss)", ("critic/loss",)),
            Panel("values vs returns", ("critic/values_mean", "critic/returns_mean")),
            Panel("critic/grad_norm", ("critic/grad_norm",)),
        ),
    ),
    Section(
        "Train/inference mismatch",
        "mismatch",
        "How far the trainer's logprobs of the generated tokens are from the generator's (1.0 and 0 are exact).",
        (
            Panel("mismatch/token_mult_prob_error", ("mismatch/token_mult_prob_error",)),
            Panel(
                "sequence mult-prob error",
                (
                    "mismatch/max_seq_mult_prob_error",
                    "mismatch/mean_seq_mult_prob_error",
                    "mismatch/min_seq_mult_prob_error",
                ),
            ),
            Panel(
                "KL / JS errors",
                ("mismatch/gen_kl_error", "mismatch/policy_kl_error", "mismatch/js_divergence_error"),
            ),
        ),
        other_keys_under="mismatch/",
    ),
    Section(
        "Policy: KL and clipping",
        "policy",
        "Fraction of tokens whose probability ratio was clipped, KL terms and entropy of the policy update.",
        (
            Panel("policy/clipfrac", ("policy/clipfrac",)),
            Panel("KL", ("policy/behaviour_kl", "policy/kl_penalty")),
            Panel("policy/approx_entropy", ("policy/approx_entropy",)),
            Panel("policy loss", ("policy/loss", "policy/actor_loss")),
            Panel("probability ratio", ("policy/probs_ratio", "policy/probs_ratio_min", "policy/probs_ratio_max")),
            Panel("policy/grad_norm", ("policy/grad_norm",)),
        ),
    ),
    Section(
        "Async buffer and staleness",
        "async",
        "Async PPO: trajectories waiting in the buffer and how many policy versions old the trained ones were.",
        (
            Panel("async/buffer_size", ("async/buffer_size",)),
            Panel("policy age (versions)", ("async/avg_policy_age", "async/max_policy_age")),
            Panel("trajectory age (steps)", ("async/avg_trajectory_age", "async/max_trajectory_age")),
            Panel("async/collector_groups_per_second", ("async/collector_groups_per_second",)),
            Panel("idle seconds by reason (and wasted on failed rollouts)", ("async/idle/*", "async/wasted/*")),
            Panel("async/failed_trajectories", ("async/failed_trajectories",)),
            Panel("dropped prompts by reason", ("async/dropped_prompts/*",)),
        ),
        other_keys_under="async/",
    ),
    Section(
        "Throughput",
        "throughput",
        "Model FLOPs utilisation: each phase's model FLOPs / (its seconds x its devices x the peak per device), and "
        "the whole step's over every device (GPUs of a known peak, or cluster.peak_tflops; the formula is in the "
        "README's Performance metrics); the padding ratio (tokens the trainers computed / real tokens, 1 = no "
        "waste); real tokens trained per second.",
        (
            Panel(
                "model FLOPs utilisation",
                MFU_KEYS,
            ),
            Panel("perf/padding_ratio", ("perf/padding_ratio",)),
            Panel("perf/trained_tokens_per_s", ("perf/trained_tokens_per_s",)),
        ),
        other_keys_under="perf/",
    ),
)

TIMING_PREFIX = "timing/"
TIMING_TOTAL = "timing/step"
# Parts of timing/step that overlap no other part, in the order they happen; stacked, they sum to about the total.
# timing/weight_sync is left out of the stack: it is spent inside timing/sync_bubble.
TIMING_PARTS = (
    "timing/generation",
    "timing/values",
    "timing/logprobs",
    "timing/critic_train",
    "timing/policy_train",
    "timing/sync_bubble",
    "timing/validation",
)


def curve_of(records: Records, key: str) -> Curve | None:
    """The (step, value) points of `key` in file order; None when no record holds a number under it."""
    steps, values = [], []
    for record in records:
        value = record.get(key)
        if isinstance(value, int | float) and not isinstance(value, bool):
            steps.append(int(record["step"]))
            values.append(float(value))
    return Curve(steps, values) if steps else None


def section_html(section: Section, runs: Sequence[Records], run_names: Sequence[str]) -> str:
    """The section's heading and one figure of its panels, or a line saying none of its metrics was logged."""
    logged = {key for records in runs for record in records for key in record}
    panels: list[PanelData] = []
    listed: set[str] = set()
    for panel in section.panels:
        keys = _expanded(panel.keys, logged)
        listed.update(keys)
        data = _panel_data(panel.caption, keys, panel.band, runs)
        if data is not None:
            panels.append(data)
    if section.other_keys_under is not None:
        for key in sorted(key for key in logged if key.startswith(section.other_keys_under) and key not in listed):
            data = _panel_data(key, (key,), {}, runs)
            if data is not None:
                panels.append(data)
    heading = f'<h2 id="{section.anchor}">{html.escape(section.heading)}</h2>\n'
    if not panels:
        return heading + f'<p class="absent">{_absent_line(section, len(runs))}</p>\n'
    image = figure_png_base64(panels, run_names)
    return heading + f"<p>{html.escape(section.about)}</p>\n" + _img(image, section.heading)


def timing_section_html(runs: Sequence[Records], run_names: Sequence[str]) -> str:
    """Step-time breakdown: the disjoint parts of timing/step stacked, per run, with the total on top."""
    heading = '<h2 id="timing">Step time</h2>\n'
    parts = [(key, [curve_of(records, key) for records in runs]) for key in TIMING_PARTS]
    parts = [(key, curves) for key, curves in parts if any(curve is not None for curve in curves)]
    totals = [curve_of(records, TIMING_TOTAL) for records in runs]
    if not parts and all(total is None for total in totals):
        where = "this run" if len(runs) == 1 else "either run"
        return heading + f'<p class="absent">No {TIMING_PREFIX}* metric was logged in {where}.</p>\n'
    about = (
        "Seconds per step by phase (stacked; the black line is timing/step, the whole step). "
        "Generation is the wait for the step's batch; sync_bubble is the weight push to the generators."
    )
    image = stacked_timing_png_base64(parts, totals, run_names)
    return heading + f"<p>{html.escape(about)}</p>\n" + _img(image, "step time") + _timing_table(runs, run_names)


def _expanded(keys: Sequence[str], logged: set[str]) -> list[str]:
    """`keys` with each `prefix*` replaced by the logged keys under the prefix (sorted)."""
    expanded = []
    for key in keys:
        if key.endswith("*"):
            expanded.extend(sorted(name for name in logged if name.startswith(key[:-1])))
        else:
            expanded.append(key)
    return expanded


def _panel_data(
    caption: str, keys: Sequence[str], band: Mapping[str, str], runs: Sequence[Records]
) -> PanelData | None:
    curves = {key: [curve_of(records, key) for records in runs] for key in keys}
    curves = {key: per_run for key, per_run in curves.items() if any(curve is not None for curve in per_run)}
    if not curves:
        return None
    bands = {key: [curve_of(records, band[key]) for records in runs] for key in curves if key in band}
    return PanelData(caption, curves, bands)


def _absent_line(section: Section, num_runs: int) -> str:
    keys = [key for panel in section.panels for key in panel.keys]
    looked_for = ", ".join(keys[:4]) + (", ..." if len(keys) > 4 else "")
    where = "this run" if num_runs == 1 else "either run"
    return html.escape(f"No {section.heading.lower()} metric was logged in {where} (looked for {looked_for}).")


def _timing_table(runs: Sequence[Records], run_names: Sequence[str]) -> str:
    """Mean seconds per step of every timing/* key, one column per run."""
    keys = sorted({key for records in runs for record in records for key in record if key.startswith(TIMING_PREFIX)})
    header = "".join(f"<th>{html.escape(name)}</th>" for name in run_names)
    rows = []
    for key in keys:
        cells = []
        for records in runs:
            curve = curve_of(records, key)
            cells.append(f"{sum(curve.values) / len(curve.values):.3f}" if curve is not None else "-")
        rows.append(f"<tr><td>{html.escape(key)}</td>" + "".join(f"<td>{cell}</td>" for cell in cells) + "</tr>")
    return f"<table><tr><th>mean seconds per step</th>{header}</tr>\n" + "\n".join(rows) + "\n</table>\n"


def _img(image_base64: str, alt: str) -> str:
    return f'<img alt="{html.escape(alt)}" src="data:image/png;base64,{image_base64}">\n'
