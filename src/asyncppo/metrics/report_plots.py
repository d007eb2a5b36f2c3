"""The figures of the run report (`metrics/report.py`), as base64 PNG text for `<img src="data:image/png;...">`.

A figure is a grid of panels; each panel draws metric curves against the step, one line per (key, run), so two
runs overlay on the same axes. Rendering uses matplotlib's Agg canvas on a bare Figure (no pyplot), as
`metrics/plots.py` does: no display, no global backend change in the caller's process.
"""

import base64
import io
import math
from collections.abc import Sequence
from dataclasses import dataclass

from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

PANEL_WIDTH_IN = 5.0
PANEL_HEIGHT_IN = 3.0
DPI = 80  # small files: a report of eight figures stays well under a megabyte
RUN_LINESTYLES = ("-", "--")  # run A solid, run B dashed (when keys, not runs, own the colors)
MAX_MARKED_POINTS = 30  # curves with fewer points (validation every N steps) get markers so single points show


@dataclass(frozen=True)
class Curve:
    """One metric of one run: `steps[i]` is the step of `values[i]`."""

    steps: list[int]
    values: list[float]


@dataclass(frozen=True)
class PanelData:
    """What one panel draws: per key (legend label), one curve per run (None where the run lacks the key).

    `bands[key]` optionally gives, per run, the spread (std) shaded around the curve: mean +- std.
    """

    caption: str
    curves: dict[str, list[Curve | None]]
    bands: dict[str, list[Curve | None]]


def figure_png_base64(panels: Sequence[PanelData], run_names: Sequence[str]) -> str:
    """A grid of the panels (two per row), encoded as base64 PNG text."""
    columns = min(2, len(panels))
    rows = math.ceil(len(panels) / columns)
    figure = _figure(columns * PANEL_WIDTH_IN, rows * PANEL_HEIGHT_IN)
    for index, panel in enumerate(panels):
        axes = figure.add_subplot(rows, columns, index + 1)
        _draw_panel(axes, panel, run_names)
    _set_margins(figure, left_in=0.7, right_in=0.2)
    return _encode(figure)


def stacked_timing_png_base64(
    parts: Sequence[tuple[str, list[Curve | None]]], totals: list[Curve | None], run_names: Sequence[str]
) -> str:
    """Where each step's wall time went: per run, one panel stacking the parts (seconds) with the step total as a
    line; the panels share the y axis so two runs compare at a glance. `parts` holds (key, per-run curve)."""
    figure = _figure(len(run_names) * PANEL_WIDTH_IN * 1.2, PANEL_HEIGHT_IN * 1.3)
    first: Axes | None = None
    for run_index, run_name in enumerate(run_names):
        axes = figure.add_subplot(1, len(run_names), run_index + 1, sharey=first)
        first = first or axes
        present = [(key, curves[run_index]) for key, curves in parts if curves[run_index] is not None]
        if present:
            steps = sorted({step for _, curve in present if curve is not None for step in curve.steps})
            stacks = [_on_steps(curve, steps) for _, curve in present if curve is not None]
            axes.stackplot(steps, stacks, labels=[_plain(key) for key, _ in present], alpha=0.8)
        total = totals[run_index]
        if total is not None:
            axes.plot(total.steps, total.values, color="black", linewidth=1.2, label="timing/step (total)")
        axes.set_title(_plain(run_name) if len(run_names) > 1 else "seconds per step", fontsize="medium")
        axes.set_xlabel("step")
        axes.set_ylabel("seconds")
        axes.grid(alpha=0.3)
        if axes.get_legend_handles_labels()[0]:
            axes.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize="x-small")  # outside: no hidden bands
    _set_margins(figure, left_in=0.7, right_in=2.0, wspace=0.75)
    return _encode(figure)


def _figure(width_in: float, height_in: float) -> Figure:
    figure = Figure(figsize=(width_in, height_in), dpi=DPI)
    FigureCanvasAgg(figure)  # attaches the Agg canvas to the figure
    return figure


def _set_margins(figure: Figure, left_in: float, right_in: float, wspace: float = 0.25) -> None:
    """Fixed margins in inches, room for titles, tick labels and axis labels: tight_layout would measure every
    text artist with an extra draw, which is most of the report's run time."""
    width, height = figure.get_size_inches()
    rows = round(height / PANEL_HEIGHT_IN) or 1
    figure.subplots_adjust(
        left=left_in / width,
        right=1 - right_in / width,
        top=1 - 0.3 / height,
        bottom=0.5 / height,
        wspace=wspace,
        hspace=0.55 if rows > 1 else 0.2,
    )


def _encode(figure: Figure) -> str:
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png")
    return base64.b64encode(buffer.getvalue()).decode("ascii")


def _draw_panel(axes: Axes, panel: PanelData, run_names: Sequence[str]) -> None:
    """One key: a color per run, labelled by run. Several keys: a color per key, a line style per run."""
    single_key = len(panel.curves) == 1
    several_runs = len(run_names) > 1
    for key_index, (key, per_run) in enumerate(panel.curves.items()):
        for run_index, curve in enumerate(per_run):
            if curve is None:
                continue
            color = f"C{run_index}" if single_key else f"C{key_index}"
            if single_key:
                label = run_names[run_index] if several_runs else key
            else:
                label = f"{key} ({run_names[run_index]})" if several_runs else key
            marker = "o" if len(curve.steps) <= MAX_MARKED_POINTS else None
            linestyle = "-" if single_key else RUN_LINESTYLES[run_index % len(RUN_LINESTYLES)]
            axes.plot(
                curve.steps,
                curve.values,
                color=color,
                linestyle=linestyle,
                marker=marker,
                markersize=3,
                label=_plain(label),
            )
            band = panel.bands.get(key, [None] * len(per_run))[run_index]
            if band is not None:
                spread = _on_steps(band, curve.steps)
                low = [value - width for value, width in zip(curve.values, spread, strict=True)]
                high = [value + width for value, width in zip(curve.values, spread, strict=True)]
                axes.fill_between(curve.steps, low, high, color=color, alpha=0.15, linewidth=0)
    axes.set_title(_plain(panel.caption), fontsize="medium")
    axes.set_xlabel("step")
    axes.grid(alpha=0.3)
    if len(axes.get_lines()) > 1 or several_runs:
        axes.legend(loc="best", fontsize="x-small")


def _plain(text: str) -> str:
    """`text` shown as is: matplotlib reads `$...$` as math (a run directory may be named `a$b`)."""
    return text.replace("$", r"\$")


def _on_steps(curve: Curve, steps: Sequence[int]) -> list[float]:
    """`curve`'s values at `steps`, 0 at steps it lacks (a timing part not measured that step took no time)."""
    by_step = dict(zip(curve.steps, curve.values, strict=True))
    return [by_step.get(step, 0.0) for step in steps]
