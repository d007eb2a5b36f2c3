"""The mismatch plot is written as a real PNG."""

import math

import torch

from asyncppo.algorithms.mismatch import mismatch_plot_data
from asyncppo.metrics.plots import save_mismatch_plot

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def test_save_mismatch_plot_writes_a_png(tmp_path):
    # Sample 1 has the larger error; its policy span is positions 2..5 with a tool token at 4.
    old = torch.tensor([[0.0, 0.0, -0.1, -0.2, 0.0, 0.0], [0.0, 0.0, -0.5, -1.0, 0.0, -0.3]])
    gen = torch.tensor([[0.0, 0.0, -0.1, -0.2, 0.0, 0.0], [0.0, 0.0, -0.4, math.log(0.1), 0.0, -0.3]])
    mask = torch.tensor([[0, 0, 1, 1, 0, 0], [0, 0, 1, 1, 0, 1]], dtype=torch.float32)
    data = mismatch_plot_data(old, gen, mask)
    assert data is not None and data.sample_index == 1
    path = save_mismatch_plot(data, tmp_path / "plots" / "mismatch_step7.png", step=7)
    assert path == tmp_path / "plots" / "mismatch_step7.png"
    content = path.read_bytes()
    assert content.startswith(PNG_SIGNATURE)
    assert len(content) > 10_000  # a drawn 1000x500 figure, not an empty canvas
