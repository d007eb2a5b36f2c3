"""The training prompt source: batches of rows, reshuffled every epoch, cycling epochs, with exact resume.

The sync driver and the async collector call `next(stream)` for each step's prompts and save `state_dict()` in
checkpoints. Within an epoch a torchdata StatefulDataLoader tracks the position; the stream owns the epoch:

    epoch e:  order = permutation(seed, e)  ->  StatefulDataLoader(rows, sampler=order, drop_last)  ->  batches
              loader exhausted  ->  epoch e + 1 with a fresh loader (until max_epochs, or forever)

Two StatefulDataLoader traps, both observed with torchdata, shape this: a loader restored from a state saved at the
end of an epoch yields nothing, and a loader that shuffles with its own generator reshuffles later epochs
differently after a resume. Here every epoch's order is a pure function of (seed, epoch), and an exhausted
restored loader just advances the stream to the next epoch like any other.
"""

import copy
import hashlib
import warnings
from collections.abc import Iterator
from typing import Any

import torch
from torchdata.stateful_dataloader import StatefulDataLoader

Row = dict[str, Any]


def epoch_order(num_rows: int, seed: int, epoch: int, shuffle: bool) -> list[int]:
    """Row indices of one epoch: a permutation seeded by (seed, epoch), or 0..num_rows-1 without shuffling.

    The generator seed hashes the pair, so distinct (seed, epoch) pairs never share a stream by arithmetic
    accident (seed + epoch would make run seed 1 epoch 0 replay run seed 0 epoch 1).
    """
    if not shuffle:
        return list(range(num_rows))
    digest = hashlib.sha256(f"prompt-stream:{seed}:{epoch}".encode()).digest()
    generator = torch.Generator().manual_seed(int.from_bytes(digest[:8], "little") & (2**63 - 1))
    return torch.randperm(num_rows, generator=generator).tolist()


def _collate_rows(rows: list[Row]) -> list[Row]:
    # Copies, so a consumer that edits a row (adding a response, say) never changes what a later epoch yields.
    return copy.deepcopy(rows)


class PromptStream:
    """Iterator over batches of `batch_size` rows (lists of dicts); raises StopIteration after max_epochs.

    `max_epochs=None` cycles forever. Every epoch yields len(rows) // batch_size batches (the remainder of an
    epoch's shuffled order is dropped, a different remainder each epoch when shuffling). `epoch` is the
    (0-based) epoch of the last batch drawn; `num_prompts_consumed` counts rows drawn over all epochs.
    """

    def __init__(
        self, rows: list[Row], batch_size: int, seed: int, shuffle: bool = True, max_epochs: int | None = None
    ) -> None:
        if not rows:
            raise ValueError("PromptStream got an empty dataset: no rows to draw prompts from")
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        if batch_size > len(rows):
            raise ValueError(
                f"batch_size {batch_size} (prompts per step) exceeds the {len(rows)} rows of the dataset; "
                "with drop_last no batch could ever be drawn"
            )
        if max_epochs is not None and max_epochs < 1:
            raise ValueError(f"max_epochs must be >= 1 or None, got {max_epochs}")
        self._rows = list(rows)  # a caller appending to its list must not shift the order mid-run
        self.batch_size = batch_size
        self.seed = seed
        self.shuffle = shuffle
        self.max_epochs = max_epochs
        self.num_batches_per_epoch = len(rows) // batch_size
        self.epoch = 0
        self.num_prompts_consumed = 0
        self._loader = self._epoch_loader(0)
        self._batches: Iterator[list[Row]] | None = None

    def _epoch_loader(self, epoch: int) -> StatefulDataLoader:
        # torchdata 0.11 calls torch.set_vital, which torch 2.13 deprecates with a warning at every construction.
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="'set_vital' is deprecated", category=UserWarning)
            # num_workers=0: rows are in memory, so worker processes would only add start-up time and pickling.
            return StatefulDataLoader(
                self._rows,  # pyright: ignore[reportArgumentType]  # a list is a valid map-style dataset
                batch_size=self.batch_size,
                sampler=epoch_order(len(self._rows), self.seed, epoch, self.shuffle),
                drop_last=True,
                collate_fn=_collate_rows,
                num_workers=0,
            )

    @property
    def finished(self) -> bool:
        """True once max_epochs epochs have been drawn completely."""
        return self.max_epochs is not None and self.epoch >= self.max_epochs

    def __iter__(self) -> "PromptStream":
        return self

    def __next__(self) -> list[Row]:
        # At most two rounds: an epoch that is already exhausted (e.g. restored from its end) yields nothing,
        # and the next epoch always yields at least one batch because batch_size <= len(rows).
        while not self.finished:
            if self._batches is None:
                self._batches = iter(self._loader)
            batch = next(self._batches, None)
            if batch is not None:
                self.num_prompts_consumed += len(batch)
                return batch
            self.epoch += 1
            self._loader = self._epoch_loader(self.epoch)
            self._batches = None
        raise StopIteration

    def state_dict(self) -> dict[str, Any]:
        """Plain data (dicts, lists, numbers): saveable with torch.save, loadable with weights_only=True."""
        return {
            "epoch": self.epoch,
            "num_prompts_consumed": self.num_prompts_consumed,
            "loader": self._loader.state_dict(),
            # Checked on load: a changed dataset or batching would silently shift every later batch.
            "num_rows": len(self._rows),
            "batch_size": self.batch_size,
            "seed": self.seed,
            "shuffle": self.shuffle,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue exactly where the stream that saved `state` was: its next batch is the one it would have drawn."""
        expected = {
            "num_rows": len(self._rows),
            "batch_size": self.batch_size,
            "seed": self.seed,
            "shuffle": self.shuffle,
        }
        saved = {key: state.get(key) for key in expected}
        if saved != expected:
            raise ValueError(
                f"prompt stream state was saved with {saved}, but this stream has {expected}: the restored order "
                "would not continue the saved run"
            )
        self.epoch = state["epoch"]
        self.num_prompts_consumed = state["num_prompts_consumed"]
        self._loader = self._epoch_loader(self.epoch)
        self._loader.load_state_dict(state["loader"])
        self._batches = None
