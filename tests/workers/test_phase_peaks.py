"""Peak memory per phase of a colocated policy process: reported on CUDA, absent on CPU."""

import threading

import pytest
import torch

from asyncppo.workers.phase_peaks import PhasePeaks


def test_a_cpu_process_reports_no_memory_peaks() -> None:
    peaks = PhasePeaks(torch.device("cpu"))
    with peaks.phase("generation"):
        torch.zeros(1000)
    assert peaks.report() == {}


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_each_phase_reports_its_own_peak_across_overlapping_callers() -> None:
    device = torch.device("cuda")
    peaks = PhasePeaks(device)
    base = torch.cuda.memory_allocated(device)
    entered, release = threading.Barrier(2), threading.Event()

    def generate(megabytes: int) -> None:
        with peaks.phase("generation"):
            block = torch.empty(megabytes * 2**20, dtype=torch.uint8, device=device)
            entered.wait()  # both callers inside: the first to leave must not end the phase
            release.wait()
            del block

    callers = [threading.Thread(target=generate, args=(size,)) for size in (256, 512)]
    for caller in callers:
        caller.start()
    release.set()
    for caller in callers:
        caller.join()
    with peaks.phase("train"):
        block = torch.empty(64 * 2**20, dtype=torch.uint8, device=device)
        del block
    report = peaks.report()
    assert report["memory/generation_peak_gib"] >= (base + 768 * 2**20) / 2**30
    assert report["memory/generation_peak_gib"] > report["memory/train_peak_gib"] >= (base + 64 * 2**20) / 2**30
