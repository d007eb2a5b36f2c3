"""The run report: one self-contained HTML page of a run directory's metrics, plots and config.

    run dir(s) --load_run--> metrics.jsonl records, config.yaml, plots/*.png
               --render_report--> summary, one section per metric family (report_sections.py), config --> .html

Called by `asyncppo report RUN_DIR [RUN_DIR_B]` and at the end of `asyncppo train`. With two runs every plot
overlays both (the legend names the run directories) and the config section shows both configs and their diff.
Plots are base64 PNGs inside the page: the file can be mailed or archived alone.
"""

import base64
import difflib
import html
import re
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from asyncppo.config import ConfigError
from asyncppo.metrics.report_sections import SECTIONS, Records, curve_of, section_html, timing_section_html
from asyncppo.metrics.sinks import read_metrics_jsonl

REPORT_NAME = "report.html"
METRICS_NAME = "metrics.jsonl"
CONFIG_NAME = "config.yaml"
MAX_MISMATCH_PLOTS = 3  # the latest few per run: each is a ~50 kB PNG
STYLE = """
body { font-family: sans-serif; max-width: 1100px; margin: 2em auto; color: #222; }
h2 { border-bottom: 1px solid #ccc; padding-bottom: 0.2em; margin-top: 2em; }
img { max-width: 100%; }
pre { background: #f6f6f6; padding: 0.8em; overflow-x: auto; font-size: 0.85em; }
table { border-collapse: collapse; margin: 0.5em 0; }
td, th { border: 1px solid #ccc; padding: 0.2em 0.6em; text-align: right; }
td:first-child, th:first-child { text-align: left; }
.absent { color: #777; font-style: italic; }
"""


@dataclass(frozen=True)
class RunRecord:
    """What the report reads from one run directory."""

    name: str
    path: Path
    records: list[dict[str, Any]]
    config_text: str | None
    mismatch_plots: list[Path]


def load_run(run_dir: Path, name: str | None = None) -> RunRecord:
    """Read a run directory; ConfigError (one line naming the path and what was expected) when it is not one."""
    if not run_dir.is_dir():
        raise ConfigError([f"{run_dir}: no such run directory; expected the directory `asyncppo train` wrote"])
    metrics_path = run_dir / METRICS_NAME
    if not metrics_path.is_file():
        raise ConfigError([f"{run_dir}: no {METRICS_NAME}; expected a run directory written by `asyncppo train`"])
    try:
        records = read_metrics_jsonl(metrics_path)
    except ValueError as error:
        raise ConfigError([f"{error}; expected one JSON object per line, as `asyncppo train` writes"]) from error
    config_path = run_dir / CONFIG_NAME
    plots = sorted((run_dir / "plots").glob("mismatch_step_*.png"), key=_step_of_plot)
    return RunRecord(
        name=name or run_dir.resolve().name,
        path=run_dir,
        records=[record for record in records if isinstance(record.get("step"), int)],
        config_text=config_path.read_text() if config_path.is_file() else None,
        mismatch_plots=plots[-MAX_MISMATCH_PLOTS:],
    )


def default_report_path(run_dirs: Sequence[Path]) -> Path:
    """RUN_DIR/report.html; for two runs RUN_DIR_A/report_vs_<B's name>.html."""
    if len(run_dirs) == 1:
        return run_dirs[0] / REPORT_NAME
    other = re.sub(r"[^A-Za-z0-9._-]+", "_", run_dirs[1].resolve().name) or "other"
    return run_dirs[0] / f"report_vs_{other}.html"


def write_report(run_dirs: Sequence[Path], output: Path | None = None) -> Path:
    """Write the report of one run, or of two overlaid, to `output` (default: `default_report_path`)."""
    if not 1 <= len(run_dirs) <= 2:
        raise ConfigError([f"report: got {len(run_dirs)} run directories; expected one, or two to compare"])
    runs = [load_run(path) for path in run_dirs]
    if len(runs) == 2 and runs[0].name == runs[1].name:  # e.g. a/run and b/run: the legend needs two names
        runs = [load_run(path, name=f"{path.resolve().parent.name}/{path.resolve().name}") for path in run_dirs]
    target = output if output is not None else default_report_path(run_dirs)
    page = render_report(runs)
    target.parent.mkdir(parents=True, exist_ok=True)
    temporary = target.with_name(f".{target.name}.tmp")
    temporary.write_text(page, encoding="utf-8")
    temporary.replace(target)  # a reader (a browser on the previous report) never sees half a page
    return target


def write_report_or_warn(run_dir: Path) -> Path | None:
    """The report of a run that just ended; a failure is one `warning:` line on stderr and None, because the run's
    own outcome (its exit status and last line) is what the caller reports."""
    try:
        return write_report([run_dir])
    except (Exception, KeyboardInterrupt) as error:  # a report must never mask the run's outcome
        reason = "interrupted" if isinstance(error, KeyboardInterrupt) else f"{type(error).__name__}: {error}"
        print(f"warning: run report not written: {reason}", file=sys.stderr, flush=True)
        return None


def render_report(runs: Sequence[RunRecord]) -> str:
    """The whole HTML page."""
    names = [run.name for run in runs]
    records: list[Records] = [run.records for run in runs]
    title = "asyncppo run report: " + " vs ".join(names)
    body = [f"<h1>{html.escape(title)}</h1>\n", _summary_html(runs), _contents_html()]
    for section in SECTIONS:
        body.append(section_html(section, records, names))
        if section.anchor == "mismatch":
            body.append(_mismatch_plots_html(runs))
    body.append(timing_section_html(records, names))
    body.append(_config_html(runs))
    return (
        '<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n'
        f"<title>{html.escape(title)}</title>\n<style>{STYLE}</style>\n</head>\n<body>\n"
        + "".join(body)
        + "</body>\n</html>\n"
    )


def _summary_html(runs: Sequence[RunRecord]) -> str:
    """One row per run: where it lives, the steps logged, the last rewards."""
    rows = []
    for run in runs:
        steps = [record["step"] for record in run.records]
        last_step = str(max(steps)) if steps else "none logged"
        cells = [
            html.escape(run.name),
            html.escape(str(run.path)),
            last_step,
            _last_value(run.records, "train/reward_mean"),
            _last_value(run.records, "val/reward_mean"),
        ]
        rows.append("<tr>" + "".join(f"<td>{cell}</td>" for cell in cells) + "</tr>")
    header = "<tr><th>run</th><th>directory</th><th>last step</th><th>last train/reward_mean</th>"
    header += "<th>last val/reward_mean</th></tr>"
    return "<table>" + header + "\n" + "\n".join(rows) + "</table>\n"


def _contents_html() -> str:
    links = [(section.anchor, section.heading) for section in SECTIONS]
    links += [("timing", "Step time"), ("config", "Config")]
    items = " | ".join(f'<a href="#{anchor}">{html.escape(heading)}</a>' for anchor, heading in links)
    return f"<p>{items}</p>\n"


def _last_value(records: Records, key: str) -> str:
    curve = curve_of(records, key)
    return f"{curve.values[-1]:.4f} (step {curve.steps[-1]})" if curve is not None else "-"


def _mismatch_plots_html(runs: Sequence[RunRecord]) -> str:
    """The latest mismatch plots of each run (worst sequence of a step with a high mismatch), if any were saved."""
    parts = []
    for run in runs:
        if not run.mismatch_plots:
            continue
        parts.append(f"<h3>{html.escape(run.name)}: worst sequences of high-mismatch steps (plots/)</h3>\n")
        for plot in run.mismatch_plots:
            encoded = base64.b64encode(plot.read_bytes()).decode("ascii")
            parts.append(f'<img alt="{html.escape(plot.name)}" src="data:image/png;base64,{encoded}">\n')
    return "".join(parts)


def _config_html(runs: Sequence[RunRecord]) -> str:
    parts = ['<h2 id="config">Config</h2>\n']
    texts = [run.config_text for run in runs]
    if len(runs) == 2 and texts[0] is not None and texts[1] is not None:
        diff = list(
            difflib.unified_diff(
                texts[0].splitlines(), texts[1].splitlines(), runs[0].name, runs[1].name, lineterm="", n=1
            )
        )
        parts.append("<h3>diff</h3>\n")
        parts.append(f"<pre>{html.escape(chr(10).join(diff))}</pre>\n" if diff else "<p>The configs are equal.</p>\n")
    for run, text in zip(runs, texts, strict=True):
        parts.append(f"<h3>{html.escape(run.name)}: {CONFIG_NAME}</h3>\n")
        if text is None:
            parts.append(f'<p class="absent">No {CONFIG_NAME} in {html.escape(str(run.path))}.</p>\n')
        else:
            parts.append(f"<pre>{html.escape(text)}</pre>\n")
    return "".join(parts)


def _step_of_plot(path: Path) -> int:
    digits = path.stem.removeprefix("mismatch_step_")
    return int(digits) if digits.isdigit() else -1
