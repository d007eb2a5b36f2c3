"""ConsoleProgress: plain lines off a terminal (CI logs), a rich bar on one; step time and ETA from a fake clock."""

import io

import pytest
from rich.console import Console

from asyncppo.metrics import ConsoleProgress


class FakeClock:
    def __init__(self, *times: float) -> None:
        self.times = list(times)

    def __call__(self) -> float:
        return self.times.pop(0)


def test_without_a_terminal_each_step_prints_one_plain_line():
    output = io.StringIO()
    console = Console(file=output, force_terminal=False, width=40)  # narrow: lines must still not wrap
    # Built at t=0; steps 3 and 4 (resumed from step 2) end at t=4 and t=10.
    progress = ConsoleProgress(
        10, 2, headline_keys=("train/loss", "critic/explained_variance"), console=console, clock=FakeClock(0, 4, 10)
    )
    progress.log(3, {"train/reward_mean": 0.5, "train/loss": 0.123456})
    # ETA after step 3: mean step time 4 s x 7 steps left = 28 s.
    progress.log(4, {"train/loss": 0.1, "critic/explained_variance": -0.25})
    # ETA after step 4: mean of (4, 6) = 5 s x 6 steps left = 30 s. No reward this step -> "-".
    progress.close()
    assert output.getvalue().splitlines() == [
        "step 3/10 | reward 0.5 | 4.0 s/step | ETA 0:00:28 | train/loss 0.1235",
        "step 4/10 | reward - | 6.0 s/step | ETA 0:00:30 | train/loss 0.1 | critic/explained_variance -0.25",
    ]


def test_sparse_logging_spreads_the_elapsed_time_over_the_steps_it_covered():
    output = io.StringIO()
    progress = ConsoleProgress(100, console=Console(file=output, force_terminal=False), clock=FakeClock(0, 50))
    progress.log(10, {})
    # 50 s over 10 steps = 5 s/step; 90 steps left -> 450 s.
    assert output.getvalue().strip() == "step 10/100 | reward - | 5.0 s/step | ETA 0:07:30"


def test_on_a_terminal_a_progress_bar_is_drawn_and_headlines_printed():
    output = io.StringIO()
    console = Console(file=output, force_terminal=True, width=120)
    progress = ConsoleProgress(
        4, headline_keys=("train/loss",), reward_key="train/score", console=console, clock=FakeClock(0, 1, 2)
    )
    progress.log(1, {"train/score": 0.75, "train/loss": 2.0})
    progress.log(2, {"train/score": 0.8, "train/loss": 1.5})
    progress.close()
    text = output.getvalue()
    assert "step 1 | train/loss 2" in text
    assert "step 2 | train/loss 1.5" in text
    assert "step 2/4" in text
    assert "reward 0.8" in text
    assert "ETA 0:00:02" in text


def test_start_step_outside_the_run_is_rejected():
    with pytest.raises(ValueError, match="start_step"):
        ConsoleProgress(5, 6, console=Console(file=io.StringIO()))
