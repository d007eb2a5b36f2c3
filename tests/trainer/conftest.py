"""Shared fixtures of the trainer tests: a tripwire on Ray's start for the checks that must come before it."""

import pytest

from asyncppo.trainer import build


@pytest.fixture
def ray_tripwire(monkeypatch: pytest.MonkeyPatch) -> None:
    """Starting Ray fails the test: every mistake must be reported before any process starts.

    A tripwire rather than `ray.is_initialized()`: a test worker may hold a session-wide Ray cluster of other tests.
    """

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("Ray was started although the run's inputs are wrong")

    monkeypatch.setattr(build, "init_local_ray", refuse)
