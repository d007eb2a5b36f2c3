"""ConsoleProgress: the run's progress on the terminal, a MetricsSink the driver adds to its MetricsLogger.

On a terminal: a rich progress bar (step / total, reward, step time, ETA) with one compact line of headline
metrics printed above it per step. Elsewhere (CI logs, files, Ray log capture) a bar would print escape codes
or nothing, so each step prints one plain line holding the same information instead.
"""

import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from datetime import timedelta

from rich.console import Console
from rich.progress import BarColumn, Progress, TaskID, TextColumn

from asyncppo.metrics.sinks import metric_floats

# ETA from the mean of the last few step times: recent enough to follow a change of pace (longer
# generations as the policy learns), long enough to smooth out steps that validate or checkpoint.
_ETA_WINDOW = 10


def format_metric(value: float) -> str:
    """4 significant digits: enough to follow a run, short enough for one line."""
    return f"{value:.4g}"


def format_duration(seconds: float) -> str:
    return str(timedelta(seconds=round(seconds)))


class ConsoleProgress:
    """Progress of steps `start_step + 1 .. total_steps`; `log(step, metrics)` is called after each step.

    reward_key names the metric shown as the reward; headline_keys the metrics of the per-step line (a key
    missing from a step's metrics is left out of that step's line). `console` and `clock` are for tests.
    """

    def __init__(
        self,
        total_steps: int,
        start_step: int = 0,
        *,
        reward_key: str = "train/reward_mean",
        headline_keys: Sequence[str] = (),
        console: Console | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if not 0 <= start_step <= total_steps:
            raise ValueError(f"start_step must be in 0..total_steps={total_steps}, got {start_step}")
        self.total_steps = total_steps
        self.reward_key = reward_key
        self.headline_keys = tuple(headline_keys)
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
        eta = sum(self._step_times) / len(self._step_times) * max(self.total_steps - step, 0)
        values = metric_floats(metrics)
        reward = format_metric(values[self.reward_key]) if self.reward_key in values else "-"
        headline = " | ".join(f"{key} {format_metric(values[key])}" for key in self.headline_keys if key in values)
        if self._progress is not None and self._task is not None:
            self._progress.update(
                self._task,
                completed=step,
                reward=reward,
                step_time=f"{step_time:.1f} s/step",
                eta=format_duration(eta),
                refresh=True,
            )
            if headline:
                self._progress.console.print(f"step {step} | {headline}", highlight=False)
            return
        parts = [
            f"step {step}/{self.total_steps}",
            f"reward {reward}",
            f"{step_time:.1f} s/step",
            f"ETA {format_duration(eta)}",
        ]
        if headline:
            parts.append(headline)
        # soft_wrap: a narrow or unknown width must not split one step's line over several lines of a log.
        self._console.print(" | ".join(parts), highlight=False, soft_wrap=True)

    def close(self) -> None:
        if self._progress is not None:
            self._progress.stop()
            self._progress = None
