"""Peak device memory per phase (generation, training) of a colocated policy process, reported with its metrics.

Used by `PolicyWorker`, whose colocated engine's KV cache and training state share one GPU.
"""

import threading
from collections.abc import Iterator
from contextlib import contextmanager

import torch


class PhasePeaks:
    """Peak device memory of named phases of a colocated policy process (CUDA only; nothing on CPU).

    A phase may be entered by several threads at once (rollout threads each call `generate`): the peak counter
    is reset when the first enters and read when the last leaves. Phases of one process do not overlap in time
    (colocated runs are synchronous: generation, then logprobs, then training).
    """

    def __init__(self, device: torch.device):
        self.device = device
        self._lock = threading.Lock()
        self._inside: dict[str, int] = {}
        self._peaks: dict[str, int] = {}

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        if self.device.type != "cuda":
            yield
            return
        with self._lock:
            self._inside[name] = self._inside.get(name, 0) + 1
            if self._inside[name] == 1:
                torch.cuda.reset_peak_memory_stats(self.device)
        try:
            yield
        finally:
            with self._lock:
                self._inside[name] -= 1
                if self._inside[name] == 0:
                    self._peaks[name] = torch.cuda.max_memory_allocated(self.device)

    def report(self) -> dict[str, float]:
        """`memory/{phase}_peak_gib` of each phase's latest run."""
        with self._lock:
            return {f"memory/{name}_peak_gib": peak / 2**30 for name, peak in self._peaks.items()}
