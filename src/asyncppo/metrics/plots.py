"""The train/inference mismatch plot as a PNG: generator vs trainer logprobs of the worst sequence of a step.

The driver calls `save_mismatch_plot` with `algorithms.mismatch.mismatch_plot_data(...)` on steps where the
mismatch is high and passes the file to `MetricsLogger.log_image`. Rendering uses matplotlib's Agg canvas on
a bare Figure (no pyplot): no display is needed and no global backend is changed in the caller's process.
"""

import os
from pathlib import Path

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from asyncppo.algorithms.mismatch import MismatchPlotData


def save_mismatch_plot(data: MismatchPlotData, path: str | os.PathLike[str], step: int) -> Path:
    """Draw `data` for training step `step` into the PNG file `path` (parent directories are created).

    Lines: generation logprobs ("generator"), the trainer's pre-update logprobs ("trainer") and their absolute
    difference (labelled with the sequence's multiplicative probability error). Markers on the difference
    line: the largest absolute logprob error (red) and the largest relative probability error (blue).
    """
    output = Path(path)
    output.parent.mkdir(parents=True, exist_ok=True)
    figure = Figure(figsize=(10, 5), dpi=100)
    FigureCanvasAgg(figure)  # attaches the Agg canvas to the figure
    axes = figure.add_subplot()
    axes.plot(data.positions, data.generation_logprobs, label="generator", linewidth=1.0)
    axes.plot(data.positions, data.training_logprobs, label="trainer", linewidth=1.0, linestyle="--")
    axes.plot(
        data.positions,
        data.abs_diff,
        label=f"|difference| (seq mult-prob error {data.seq_mult_prob_error:.4f})",
        linewidth=1.0,
        color="gray",
    )
    start = data.positions[0]
    max_abs = data.max_abs_error_position
    max_rel = data.max_rel_error_position
    axes.scatter(
        [max_abs],
        [data.abs_diff[max_abs - start]],
        color="red",
        s=80,  # larger than the blue marker, which often sits on the same token
        zorder=3,
        label=f"max |difference| {data.abs_diff[max_abs - start]:.4f} at t={max_abs}",
    )
    axes.scatter(
        [max_rel],
        [data.abs_diff[max_rel - start]],
        color="blue",
        s=25,
        zorder=4,
        label=f"max relative prob error at t={max_rel}",
    )
    axes.set_xlabel("token position")
    axes.set_ylabel("logprob")
    axes.set_title(f"step {step}: train/inference mismatch, sample {data.sample_index}")
    axes.legend(loc="best", fontsize="small")
    figure.tight_layout()
    figure.savefig(output, format="png")
    return output
