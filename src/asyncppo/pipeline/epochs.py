"""EpochCycler: the collector's endless view of a prompt stream, which starts the next epoch when one ends.

The collector's loop thread calls `next_rows()` for each batch it draws and `restart()` after a restore.
"""

from collections.abc import Iterator

from asyncppo.pipeline.errors import CollectorError
from asyncppo.pipeline.sources import PromptBatches, Row


class EpochCycler:
    """Batches of `prompts`, epoch after epoch; two epochs in a row without a batch mean there is nothing to draw."""

    def __init__(self, prompts: PromptBatches) -> None:
        self._prompts = prompts
        self._batches: Iterator[list[Row]] | None = None  # only the collector's loop thread touches the stream
        self._batches_this_epoch = 0
        self._empty_epochs_in_a_row = 0

    def restart(self) -> None:
        """Start over from the stream's current position (after its state was loaded)."""
        self._batches = None

    def next_rows(self) -> list[Row]:
        """The next batch, starting a new epoch when the current one is exhausted."""
        while True:
            if self._batches is None:
                self._batches = iter(self._prompts)
                self._batches_this_epoch = 0
            batch = next(self._batches, None)
            if batch is not None:
                if not batch:
                    raise CollectorError("the prompt stream yielded an empty batch")
                self._batches_this_epoch += 1
                self._empty_epochs_in_a_row = 0
                return list(batch)
            # A resumed stream may yield nothing in its first epoch (restored at the epoch's end); only a second
            # empty epoch in a row means the data is gone.
            if self._batches_this_epoch == 0:
                self._empty_epochs_in_a_row += 1
            self._batches = None
            if self._empty_epochs_in_a_row >= 2:
                raise CollectorError(
                    "the prompt stream yielded no prompts in two consecutive epochs: the dataset is empty or "
                    "exhausted (async collection needs a stream that cycles epochs, e.g. max_epochs=None)"
                )
