"""ConsoleProgress: plain lines off a terminal (CI logs), a rich bar on one; step time and ETA from a fake clock;
short labels that keep a step line within 100 columns; hints printed once, the first time a metric is negative."""

import io

import pytest
from rich.console import Console

from asyncppo.metrics import ConsoleProgress
from asyncppo.metrics.console import LINE_WIDTH, METRIC_WIDTH, format_duration, format_metric
from asyncppo.trainer.run_metrics import HEADLINE_KEYS


class FakeClock:
    def __init__(self, *times: float) -> None:
        self.times = list(times)

    def __call__(self) -> float:
        return self.times.pop(0)


def plain_console(width: int = 200) -> tuple[Console, io.StringIO]:
    output = io.StringIO()
    return Console(file=output, force_terminal=False, width=width), output


def test_without_a_terminal_each_step_prints_one_plain_line():
    console, output = plain_console(width=40)  # narrow: lines must still not wrap
    # Built at t=0; steps 3 and 4 (resumed from step 2) end at t=4 and t=10.
    progress = ConsoleProgress(
        10, 2, headline={"train/loss": "loss", "critic/ev": "EV"}, console=console, clock=FakeClock(0, 4, 10)
    )
    progress.log(3, {"train/reward_mean": 0.5, "train/loss": 0.123456})
    # ETA after step 3: mean step time 4 s x 7 steps left = 28 s.
    progress.log(4, {"train/loss": 0.1, "critic/ev": -0.25})
    # ETA after step 4: mean of (4, 6) = 5 s x 6 steps left = 30 s. A headline key missing from a step is left out.
    progress.close()
    assert output.getvalue().splitlines() == [
        "step 3/10  loss 0.123  ETA 0:00:28",
        "step 4/10  loss 0.1  EV -0.25  ETA 0:00:30",
    ]


def test_sparse_logging_spreads_the_elapsed_time_over_the_steps_it_covered():
    console, output = plain_console()
    progress = ConsoleProgress(100, console=console, clock=FakeClock(0, 50))
    progress.log(10, {})
    # 50 s over 10 steps = 5 s/step; 90 steps left -> 450 s.
    assert output.getvalue().strip() == "step 10/100  ETA 0:07:30"


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (0.61328, "0.613"),
        (-0.14951, "-0.15"),  # 3 digits round up to -0.15
        (-0.040213, "-0.04"),  # -0.0402 is 7 characters: 2 digits
        (1.0, "1"),
        (32.0, "32"),
        (123456.0, "123456"),
        (-1234567.0, "-1.2e6"),
        (12345.678, "1.23e4"),
        (-1.2345e-7, "-1e-7"),
        (float("nan"), "nan"),
        (float("-inf"), "-inf"),
    ],
)
def test_metric_values_keep_3_significant_digits_within_the_width(value: float, text: str):
    assert format_metric(value) == text
    assert len(text) <= METRIC_WIDTH


def test_durations_fit_8_characters_for_runs_of_years():
    assert format_duration(28) == "0:00:28"
    assert format_duration(86399) == "23:59:59"
    assert format_duration(3 * 86400 + 4 * 3600 + 59) == "3d04h"
    assert len(format_duration(999 * 86400 + 23 * 3600)) <= 8


def test_a_plain_line_with_every_headline_metric_fits_100_columns_even_at_worst():
    # Worst case: 5-digit step counts, every headline metric present and each value at the widest the
    # formatter writes. The step and the metrics alone take 95 columns, so the ETA (here 23:59:59) is left out
    # rather than wrapped.
    console, output = plain_console()
    progress = ConsoleProgress(99999, 99998, headline=HEADLINE_KEYS, console=console, clock=FakeClock(0, 86399))
    widest = -0.1234  # "-0.123": METRIC_WIDTH characters, as wide as any value prints (1.2e-5, -1.2e6, ...)
    assert len(format_metric(widest)) == METRIC_WIDTH
    progress.log(99999, dict.fromkeys(HEADLINE_KEYS, widest))
    (line,) = output.getvalue().splitlines()
    assert len(line) <= LINE_WIDTH, line
    for label in HEADLINE_KEYS.values():
        assert f"  {label} -0.123" in line
    assert "ETA" not in line


def test_a_plain_line_of_the_demo_with_every_headline_metric_keeps_its_eta():
    # An async demo step of a 200-step run: every metric present, typical widths.
    console, output = plain_console()
    progress = ConsoleProgress(200, 198, headline=HEADLINE_KEYS, console=console, clock=FakeClock(0, 2.8))
    metrics = {
        "train/reward_mean": 0.6328,
        "val/reward_mean": 0.6133,
        "async/buffer_size": 32,
        "async/avg_policy_age": 0.97,
        "critic/explained_var": -0.04021,
        "mismatch/token_mult_prob_error": 1.141,
        "timing/step": 2.752,
    }
    progress.log(199, metrics)
    (line,) = output.getvalue().splitlines()
    assert line == "step 199/200  reward 0.633  val 0.613  buf 32  age 0.97  EV -0.04  mismatch 1.14  ETA 0:00:03"
    assert len(line) <= LINE_WIDTH


def test_a_hint_is_printed_once_the_first_time_its_metric_is_negative():
    console, output = plain_console()
    progress = ConsoleProgress(
        5,
        headline={"critic/ev": "EV"},
        negative_hints={"critic/ev": "hint: EV < 0"},
        console=console,
        clock=FakeClock(*range(6)),
    )
    for step, ev in enumerate([0.0, 0.3, -0.1, -0.2, -0.3], start=1):
        progress.log(step, {"critic/ev": ev})
    lines = output.getvalue().splitlines()
    assert lines.count("hint: EV < 0") == 1
    # After step 3's line, the first step whose EV is below 0 (0 itself is not).
    assert lines.index("hint: EV < 0") == lines.index(next(line for line in lines if line.startswith("step 3/5"))) + 1


def test_no_hint_while_the_metric_is_absent_or_not_negative():
    console, output = plain_console()
    progress = ConsoleProgress(
        3, negative_hints={"critic/ev": "hint: EV < 0"}, console=console, clock=FakeClock(*range(4))
    )
    progress.log(1, {})
    progress.log(2, {"critic/ev": 0.5})
    progress.log(3, {"critic/ev": float("nan")})
    assert "hint" not in output.getvalue()


def test_on_a_terminal_a_progress_bar_is_drawn_and_headlines_and_hints_printed():
    output = io.StringIO()
    console = Console(file=output, force_terminal=True, width=120)
    progress = ConsoleProgress(
        4,
        headline={"train/loss": "loss"},
        negative_hints={"train/loss": "hint: negative loss"},
        reward_key="train/score",
        console=console,
        clock=FakeClock(0, 1, 2),
    )
    progress.log(1, {"train/score": 0.75, "train/loss": 2.0})
    progress.log(2, {"train/score": 0.8, "train/loss": -1.5})
    progress.close()
    text = output.getvalue()
    assert "step 1  loss 2" in text
    assert "step 2  loss -1.5" in text
    assert text.count("hint: negative loss") == 1
    assert "step 2/4" in text
    assert "reward 0.8" in text
    assert "ETA 0:00:02" in text


def test_start_step_outside_the_run_is_rejected():
    with pytest.raises(ValueError, match="start_step"):
        ConsoleProgress(5, 6, console=Console(file=io.StringIO()))
