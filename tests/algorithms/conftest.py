"""Fixtures of the algorithm tests: float64 as the default dtype, for modules whose expected values are computed by
hand (`pytestmark = pytest.mark.usefixtures("float64")`)."""

from collections.abc import Iterator

import pytest
import torch


@pytest.fixture
def float64() -> Iterator[None]:
    """Hand-computed values are checked in float64; the default dtype is restored for other modules."""
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    yield
    torch.set_default_dtype(previous)
