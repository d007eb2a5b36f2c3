"""ConsoleProgress: the run's progress on the terminal, a MetricsSink the driver adds to its MetricsLogger.

On a terminal: a rich progress bar (step / total, reward, step time, ETA) with one compact line of headline
metrics printed above it per step. Elsewhere (CI logs, files, Ray log capture) a bar would print escape codes
or nothing, so each step prints one plain line instead:

    step 4/200  reward 0.633  val 0.613  buf 1  age 1  EV -0.04  mismatch 1.14  ETA 0:09:10

Headline metrics show under short labels, each value in at most `METRIC_WIDTH` characters, so a plain line
fits `LINE_WIDTH` columns: with 5-digit step counts and every value at full width, the step and six labelled
metrics take 95; the ETA is left out of a line it would push past the width. Hints (one line each, printed
once per run) explain a metric the first time it goes negative.
"""

import re
import time
from collections import deque
from collections.abc import Callable, Mapping
from datetime import timedelta

from rich.console import Console
from rich.progress import BarColumn, Progress, TaskID, TextColumn

from asyncppo.metrics.sinks import metric_floats

# ETA from the mean of the last few step times: recent enough to follow a change of pace (longer
# generations as the policy learns), long enough to smooth out steps that validate or checkpoint.
_ETA_WINDOW = 10
LINE_WIDTH = 100
"""Columns a plain step line may take (a log viewer or a terminal of 100 columns shows it unwrapped)."""
METRIC_WIDTH = 6
"""Characters a metric value may take on the console (the JSONL file keeps every digit)."""
_SEPARATOR = "  "
_EXPONENT = re.compile(r"e([+-])0*(\d)")


def format_metric(value: float) -> str:
    """3 significant digits, fewer where needed to stay within METRIC_WIDTH characters: 0.613, -0.04, 1.2e5.

    Whole numbers print as integers (a buffer of 32 groups is `32`); exponents drop `+` and leading zeros.
    """
    if value.is_integer() and len(str(int(value))) <= METRIC_WIDTH:
        return str(int(value))
    text = ""
    for digits in (3, 2, 1):
        text = _EXPONENT.sub(lambda match: "e" + match[1].replace("+", "") + match[2], f"{value:.{digits}g}")
        if len(text) <= METRIC_WIDTH:
            break
    return text


def format_duration(seconds: float) -> str:
    """H:MM:SS below a day, then days and hours (`3d04h`): at most 8 characters for runs under 3 years."""
    whole = round(seconds)
    if whole < 86400:
        return str(timedelta(seconds=whole))
    days, rest = divmod(whole, 86400)
    return f"{days}d{rest // 3600:02d}h"


class ConsoleProgress:
    """Progress of steps `start_step + 1 .. total_steps`; `log(step, metrics)` is called after each step.

    reward_key names the metric shown as the bar's reward; headline maps the metrics of the per-step line to
    their labels, in order (a key missing from a step's metrics is left out of that step's line). negative_hints
    maps a metric to a line printed the first time its value is below 0. `console` and `clock` are for tests.
    """

    def __init__(
        self,
        total_steps: int,
        start_step: int = 0,
        *,
        reward_key: str = "train/reward_mean",
        headline: Mapping[str, str] | None = None,
        negative_hints: Mapping[str, str] | None = None,
        console: Console | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if not 0 <= start_step <= total_steps:
            raise ValueError(f"start_step must be in 0..total_steps={total_steps}, got {start_step}")
        self.total_steps = total_steps
        self.reward_key = reward_key
        self.headline = dict(headline or {})
        self._pending_hints = dict(negative_hints or {})
        self._console = console if console is not None else Console()
        self._clock = clock
        self._last_step = start_step
        self._last_time = clock()
        self._step_times: deque[float] = deque(maxlen=_ETA_WINDOW)
        self._progress: Progress | None = None
        self._task: TaskID | None = None
        if self._console.is_terminal:
            self._progress = Progress(
                TextColumn("step {task.completed:.0f}/{task.total:.0f}"),
                BarColumn(),
                TextColumn("reward {task.fields[reward]}"),
                TextColumn("{task.fields[step_time]}"),
                TextColumn("ETA {task.fields[eta]}"),
                console=self._console,
            )
            self._task = self._progress.add_task(
                "train", total=total_steps, completed=start_step, reward="-", step_time="-", eta="-"
            )
            self._progress.start()

    def log(self, step: int, metrics: Mapping[str, float]) -> None:
        now = self._clock()
        # Steps may be logged sparsely; spread the elapsed time over the steps it covered.
        num_steps = max(step - self._last_step, 1)
        step_time = (now - self._last_time) / num_steps
        self._step_times.extend([step_time] * min(num_steps, _ETA_WINDOW))
        self._last_step, self._last_time = step, now
        eta = format_duration(sum(self._step_times) / len(self._step_times) * max(self.total_steps - step, 0))
        values = metric_floats(metrics)
        headline = _SEPARATOR.join(
            f"{label} {format_metric(values[key])}" for key, label in self.headline.items() if key in values
        )
        if self._progress is not None and self._task is not None:
            reward = format_metric(values[self.reward_key]) if self.reward_key in values else "-"
            self._progress.update(
                self._task, completed=step, reward=reward, step_time=f"{step_time:.1f} s/step", eta=eta, refresh=True
            )
            if headline:
                self._progress.console.print(_SEPARATOR.join([f"step {step}", headline]), highlight=False)
        else:
            self._print(step_line(step, self.total_steps, headline, eta))
        self._print_hints(values)

    def _print_hints(self, values: Mapping[str, float]) -> None:
        for key in [key for key in self._pending_hints if values.get(key, 0.0) < 0]:
            self._print(self._pending_hints.pop(key))

    def _print(self, line: str) -> None:
        console = self._progress.console if self._progress is not None else self._console
        # soft_wrap: a narrow or unknown width must not split one line over several lines of a log.
        console.print(line, highlight=False, soft_wrap=True)

    def close(self) -> None:
        if self._progress is not None:
            self._progress.stop()
            self._progress = None


def step_line(step: int, total_steps: int, headline: str, eta: str) -> str:
    """The plain line of one step: step / total, the headline metrics, then the ETA where it fits LINE_WIDTH."""
    parts = [f"step {step}/{total_steps}"] + ([headline] if headline else [])
    with_eta = _SEPARATOR.join([*parts, f"ETA {eta}"])
    return with_eta if len(with_eta) <= LINE_WIDTH else _SEPARATOR.join(parts)
