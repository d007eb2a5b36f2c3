"""The built-in agent's choice of policy server: the URL with the fewest of its rollouts running, ties taken in
turn, and a lease given back when its rollout ends, also when it fails."""

import pytest

from asyncppo.gym.servers.least_loaded import LeastLoaded


def test_lone_rollouts_take_the_servers_in_turn() -> None:
    chooser = LeastLoaded(["a", "b", "c"])
    chosen = []
    for _ in range(4):
        with chooser.lease() as url:
            chosen.append(url)
    assert chosen == ["a", "b", "c", "a"]
    assert chooser.in_flight() == [0, 0, 0]


def test_new_rollouts_avoid_the_server_that_runs_a_long_one() -> None:
    chooser = LeastLoaded(["a", "b"])
    with chooser.lease() as long_rollout:
        short_rollouts = []
        for _ in range(3):  # taking turns would send the second of them to "a"
            with chooser.lease() as url:
                short_rollouts.append(url)
        with chooser.lease() as first, chooser.lease() as second:  # "b" busy too: a tie, then "a" is lighter
            assert chooser.in_flight() == [2, 1]
    assert (long_rollout, short_rollouts, first, second) == ("a", ["b", "b", "b"], "b", "a")
    assert chooser.in_flight() == [0, 0]


def test_a_failed_rollout_gives_its_lease_back() -> None:
    chooser = LeastLoaded(["a", "b"])
    with pytest.raises(RuntimeError, match="upstream down"), chooser.lease():
        assert chooser.in_flight() == [1, 0]
        raise RuntimeError("upstream down")
    assert chooser.in_flight() == [0, 0]


def test_no_url_to_choose_from_is_an_error() -> None:
    with pytest.raises(ValueError, match="urls: need at least one URL"):
        LeastLoaded([])
