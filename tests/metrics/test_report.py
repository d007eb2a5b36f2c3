"""`asyncppo report`: the HTML page of a run directory, its sections and embedded PNGs, two runs overlaid, bad input.

The run directories are synthesised with the metric keys a real demo run logs (sync: `asyncppo train
examples/configs/demo.yaml`; async: the same with ppo.async_ppo.enabled=true), written by the real JSONL sink.
"""

import base64
import io
import math
from html.parser import HTMLParser
from pathlib import Path

import pytest
from PIL import Image

from asyncppo.cli.main import main
from asyncppo.metrics import JsonlSink
from asyncppo.metrics.report import default_report_path, write_report, write_report_or_warn

SECTION_HEADINGS = [
    "Reward",
    "Validation",
    "Critic",
    "Train/inference mismatch",
    "Policy: KL and clipping",
    "Async buffer and staleness",
    "Throughput",
    "Step time",
    "Config",
]
PNG_PREFIX = "data:image/png;base64,"
STEPS = 6
VAL_PERIOD = 3


class _ReportParser(HTMLParser):
    """Collects the h2 headings, the img sources and all text of a page."""

    def __init__(self) -> None:
        super().__init__()
        self.headings: list[str] = []
        self.images: list[str] = []
        self.text: list[str] = []
        self._in_h2 = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "h2":
            self._in_h2 = True
            self.headings.append("")
        if tag == "img":
            self.images.append(dict(attrs)["src"] or "")

    def handle_endtag(self, tag: str) -> None:
        if tag == "h2":
            self._in_h2 = False

    def handle_data(self, data: str) -> None:
        self.text.append(data)
        if self._in_h2:
            self.headings[-1] += data


def _parse(path: Path) -> _ReportParser:
    parser = _ReportParser()
    parser.feed(path.read_text(encoding="utf-8"))
    parser.close()
    return parser


def _png_size(src: str) -> tuple[int, int]:
    assert src.startswith(PNG_PREFIX), src[:60]
    with Image.open(io.BytesIO(base64.b64decode(src.removeprefix(PNG_PREFIX), validate=True))) as image:
        assert image.format == "PNG"
        image.load()  # decodes every pixel: a truncated stream fails here
        return image.size


def _step_metrics(step: int, async_run: bool, perf: bool) -> dict[str, float]:
    reward = 0.55 + 0.03 * step
    metrics = {
        "train/reward_mean": reward,
        "train/reward_std": 0.48,
        "train/processed_reward_mean": reward,
        "train/response_length_mean": 2.9,
        "train/response_length_max": 4.0,
        "train/truncated_frac": 0.0,
        "critic/explained_var": math.nan if step == 1 else -0.15 + 0.05 * step,  # NaN: no variance that step
        "critic/explained_var_last_pass": -0.1 + 0.05 * step,
        "critic/loss": 0.134 - 0.002 * step,
        "critic/values_mean": 0.01 * step,
        "critic/returns_mean": 0.0,
        "critic/grad_norm": 0.2,
        "mismatch/token_mult_prob_error": 1.0 + 0.01 * step,
        "mismatch/gen_kl_error": 1e-5,
        "mismatch/policy_kl_error": 1e-5,
        "mismatch/js_divergence_error": 1e-6,
        "mismatch/max_seq_mult_prob_error": 1.05,
        "mismatch/mean_seq_mult_prob_error": 1.01,
        "mismatch/min_seq_mult_prob_error": 1.0,
        "policy/clipfrac": 0.02 * step,
        "policy/behaviour_kl": 0.001,
        "policy/kl_penalty": 0.0,
        "policy/approx_entropy": 0.8,
        "policy/loss": -0.01,
        "policy/grad_norm": 0.3,
        "timing/generation": 0.2,
        "timing/values": 0.1,
        "timing/logprobs": 0.15,
        "timing/critic_train": 0.5,
        "timing/policy_train": 0.7,
        "timing/sync_bubble": 0.01,
        "timing/step": 1.8,
    }
    if perf:  # as on a GPU of known peak; a CPU run logs only the padding ratio and the tokens per second
        metrics |= {
            "perf/policy_train_mfu": 0.31,
            "perf/critic_train_mfu": 0.28,
            "perf/logprobs_mfu": 0.2,
            "perf/values_mfu": 0.19,
            "perf/step_flops_utilization": 0.12,
            "perf/padding_ratio": 1.2,
            "perf/trained_tokens_per_s": 5400.0 + 10 * step,
        }
    if step % VAL_PERIOD == 0:
        metrics |= {"val/reward_mean": reward, "val/num_samples": 256.0, "timing/validation": 0.25}
    if async_run:
        metrics |= {
            "async/buffer_size": 32.0,
            "async/avg_policy_age": 1.0,
            "async/max_policy_age": 1.0,
            "async/avg_trajectory_age": 1.0,
            "async/max_trajectory_age": 1.0,
            "async/collector_groups_per_second": 14.0,
            "async/idle/buffer_starvation": 0.0,
            "async/failed_trajectories": 0.0,
            "async/dropped_prompts/stale": 0.0,
            "async/dropped_prompts/surplus": 2.0,
            "timing/weight_sync": 0.01,
        }
    return metrics


def _run_dir(root: Path, name: str, *, async_run: bool, lr: float = 0.0003, perf: bool = True) -> Path:
    run_dir = root / name
    sink = JsonlSink(run_dir / "metrics.jsonl")
    sink.log(0, {"val/reward_mean": 0.55, "val/num_samples": 256.0})  # validation before the first step
    for step in range(1, STEPS + 1):
        sink.log(step, _step_metrics(step, async_run, perf))
    sink.close()
    (run_dir / "config.yaml").write_text(f"model:\n  optimizer:\n    lr: {lr}\nppo:\n  max_num_steps: {STEPS}\n")
    (run_dir / "plots").mkdir()
    Image.new("RGB", (40, 20), "white").save(run_dir / "plots" / "mismatch_step_4.png")
    return run_dir


def test_report_of_one_run_has_every_section_every_plot_a_png_and_absent_metrics_in_one_line(tmp_path):
    run_dir = _run_dir(tmp_path, "sync-run", async_run=False, perf=False)  # a run from before perf/* existed
    path = write_report([run_dir])
    assert path == run_dir / "report.html"
    page = _parse(path)
    assert page.headings == SECTION_HEADINGS
    # One figure per metric section but the async one, the step-time figure, and the saved mismatch plot.
    assert len(page.images) == 7
    for src in page.images:
        width, height = _png_size(src)
        assert width > 0 and height > 0
    text = "".join(page.text)
    absent = [line for line in text.splitlines() if "was logged" in line]
    assert absent == [
        "No async buffer and staleness metric was logged in this run (looked for async/buffer_size, "
        "async/avg_policy_age, async/max_policy_age, async/avg_trajectory_age, ...).",
        "No throughput metric was logged in this run (looked for perf/policy_train_mfu, perf/critic_train_mfu, "
        "perf/logprobs_mfu, perf/reference_logprobs_mfu, ...).",
    ]
    assert "lr: 0.0003" in text and "max_num_steps: 6" in text  # the config, as text


def test_report_of_two_runs_overlays_them_names_both_and_diffs_the_configs(tmp_path, capsys):
    first = _run_dir(tmp_path, "async-run", async_run=True)
    second = _run_dir(tmp_path, "sync-run", async_run=False, lr=0.001)
    target = tmp_path / "elsewhere" / "compare.html"
    assert main(["report", str(first), str(second), "-o", str(target)]) == 0
    assert capsys.readouterr().out == f"{target}\n"
    page = _parse(target)
    assert page.headings == SECTION_HEADINGS
    assert len(page.images) == 9 + 1  # every section plotted (async from the first run), a mismatch plot per run
    for src in page.images:
        width, height = _png_size(src)
        assert width > 0 and height > 0
    text = "".join(page.text)
    assert "async-run vs sync-run" in text
    assert "was logged" not in text
    assert "-    lr: 0.0003\n+    lr: 0.001" in text  # the config diff
    assert "async-run: config.yaml" in text and "sync-run: config.yaml" in text


def test_default_report_paths(tmp_path):
    assert default_report_path([tmp_path / "a"]) == tmp_path / "a" / "report.html"
    assert default_report_path([tmp_path / "a", tmp_path / "runs" / "b c"]) == tmp_path / "a" / "report_vs_b_c.html"


@pytest.mark.parametrize("make", ["missing", "no_metrics"])
def test_a_path_that_is_no_run_directory_is_one_error_line_and_exit_2(tmp_path, capsys, make):
    run_dir = tmp_path / "run"
    if make == "no_metrics":
        run_dir.mkdir()
    assert main(["report", str(run_dir)]) == 2
    captured = capsys.readouterr()
    expected = "no such run directory" if make == "missing" else "no metrics.jsonl"
    assert captured.out == ""
    assert captured.err.startswith(f"error: {run_dir}: {expected}; expected ") and captured.err.count("\n") == 1


def test_a_report_that_cannot_be_written_after_training_is_one_warning_line(tmp_path, capsys):
    assert (
        write_report_or_warn(tmp_path / "never-started") is None
    )  # no metrics.jsonl: the run died before its first log
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.startswith("warning: run report not written: ConfigError: ")
    assert captured.err.count("\n") == 1
