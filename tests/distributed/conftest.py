"""Two generator stand-in processes shared by the whole session: spawning one costs ~2 s of torch import."""

from collections.abc import Iterator

import pytest
from sync_peer import Peer


@pytest.fixture(scope="session")
def peers() -> Iterator[list[Peer]]:
    started = [Peer(), Peer()]
    for peer in started:
        peer.call("ping")  # wait out the start-up here, so that tests can use short join timeouts
    yield started
    for peer in started:
        peer.stop()
