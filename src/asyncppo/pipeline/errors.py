"""The errors the async pipeline raises to the driver (never swallowed, never retried here).

Collector rollout or loop failure --> CollectorError (its __cause__ is the original exception)
no buffer progress for watchdog_timeout_s, or a weight-update drain that never ends --> StallError
more prompt groups failed while filling one step than the failure budget allows --> StepFillError
a rollout's generator process died (it is restarted; the groups run again, books unchanged) --> GenerationInterrupted
a failure nothing here can mend (a trainer process died, generator restarts ran out) --> RunEndingError, as it is

Messages name a step as the progress line and the metrics do: by `step_number`, counting from 1.
"""


def step_number(step: int) -> int:
    """The number users see for the step the pipeline calls `step` (its index from 0, the weight version it starts
    from): steps count from 1, as in the progress line `step N/M` and the metrics logged at N after the N-th step."""
    return step + 1


class CollectorError(RuntimeError):
    """The collector stopped producing: a rollout raised, its loop raised, or the prompt stream ran dry."""


class StallError(TimeoutError):
    """The pipeline made no progress within its watchdog; the message names what was awaited and what exists."""


class StepFillError(RuntimeError):
    """A step's batch could not be filled: more prompt groups failed than the per-step budget allows.

    Its __cause__ is the last group's failure; the message names the step, the count and the budget."""


class RunEndingError(RuntimeError):
    """A failure that no retry or replacement mends (a trainer process died, generator restarts ran out).

    It reaches the driver as it is (the collector does not wrap it), and its message is one self-contained line that
    `asyncppo train` prints before exiting with status 1."""


class GenerationInterrupted(RuntimeError):
    """A rollout lost its generation requests because a generator process died. The generator is restarted and
    brought to the current weights, and the sources run the rollout's prompt groups again (same draw ids), so
    nothing is counted as failed and the books do not change."""
