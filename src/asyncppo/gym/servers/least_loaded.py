"""LeastLoaded: the built-in agent's choice of policy server for each rollout (`servers/agent.py`).

rollout --lease()--> the URL with the fewest rollouts of this agent on it --> released when the rollout ends
"""

import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager


class LeastLoaded:
    """Hands out the URL with the fewest leases held, and takes the lease back when its holder is done.

    The agent leases one policy server per rollout, so all its turns reach one engine (Gym's sticky sessions;
    the engine reuses the conversation's prefix); a rollout sends one request at a time, so a URL's lease count
    is the agent's requests in flight there, plus rollouts that are between turns (at a tool). Counts cover
    this agent's own calls only: agents do not share them, and a generator's other callers are not seen.
    """

    def __init__(self, urls: Sequence[str]):
        if not urls:
            raise ValueError("urls: need at least one URL to choose from, got none")
        self.urls = list(urls)
        self._leases = [0] * len(self.urls)
        # Ties go to the first URL at or after this index, which moves past each choice: lone rollouts at light
        # load (every URL idle, all tied) take the URLs in turn instead of all landing on the first one.
        self._next = 0
        self._lock = threading.Lock()  # the agent's event loop is one thread, but the class is not tied to it

    def in_flight(self) -> list[int]:
        """Leases held on each URL, in the order the URLs were given."""
        with self._lock:
            return list(self._leases)

    @contextmanager
    def lease(self) -> Iterator[str]:
        """The least-leased URL, held until the block ends (normally or with an error)."""
        with self._lock:
            search_order = [(self._next + offset) % len(self.urls) for offset in range(len(self.urls))]
            index = min(search_order, key=self._leases.__getitem__)  # the first of the least leased
            self._next = (index + 1) % len(self.urls)
            self._leases[index] += 1
        try:
            yield self.urls[index]
        finally:
            with self._lock:
                self._leases[index] -= 1
