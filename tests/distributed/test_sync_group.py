"""Opening and breaking the sync group: absent participants and a generator that dies mid-push end in a
WeightSyncError naming who and what, within the timeout plus a margin, never a hang."""

import os
import time

import pytest
from sync_peer import Peer, make_model

from asyncppo.distributed.process_group import (
    SyncGroupSpec,
    WeightSyncError,
    _connect_store,  # pyright: ignore[reportPrivateUsage]  -- the store alone, without peers to join it
    free_port,
    open_sync_group,
)
from asyncppo.distributed.weight_sync import WeightSender, param_specs
from listening_sockets import listeners

pytestmark = pytest.mark.integration

# Slack for scheduling on two busy cores; the calls themselves are bounded by timeout_s.
MARGIN_S = 2.0


def _spec(world_size: int, timeout_s: float) -> SyncGroupSpec:
    return SyncGroupSpec("127.0.0.1", free_port(), world_size, "gloo", timeout_s)


def test_the_trainer_gives_up_after_the_timeout_naming_the_missing_ranks() -> None:
    spec = _spec(world_size=3, timeout_s=1.0)
    started = time.monotonic()
    with pytest.raises(WeightSyncError, match=r"rank 0: .* waited 1 s for 3 ranks; joined \[0\], missing \[1, 2\]"):
        open_sync_group(spec, rank=0)
    assert 1.0 <= time.monotonic() - started < 1.0 + MARGIN_S


def test_the_store_listens_on_the_spec_host_only() -> None:
    # Unauthenticated: torch's default server would listen on every interface (`[::]:port`).
    spec = _spec(world_size=2, timeout_s=5.0)
    store = _connect_store(spec, rank=0, deadline=time.monotonic() + spec.timeout_s)
    try:
        on_port = [listener.address for listener in listeners([os.getpid()]) if listener.port == spec.port]
        assert on_port == ["127.0.0.1"]
    finally:
        del store


def test_a_generator_without_a_trainer_gives_up_after_the_timeout() -> None:
    spec = _spec(world_size=2, timeout_s=1.0)
    started = time.monotonic()
    with pytest.raises(WeightSyncError, match=r"rank 1 could not reach the sync store of rank 0 at 127.0.0.1:\d+"):
        open_sync_group(spec, rank=1)
    assert time.monotonic() - started < 1.0 + MARGIN_S


def test_a_generator_dying_after_the_header_fails_the_push_naming_rank_and_bucket() -> None:
    peer = Peer()  # its own process: this test kills it
    try:
        peer.call("ping")  # started up, so the join below is quick
        trainer = make_model(seed=0, big_numel=1 << 20)  # 4 MiB, more than the socket buffers hold
        specs = param_specs(trainer.named_parameters())
        spec = _spec(world_size=2, timeout_s=3.0)
        peer.send("open", spec=spec, rank=1)
        with open_sync_group(spec, rank=0) as group:
            peer.result()
            sender = WeightSender(group, specs, bucket_size_bytes=1 << 16)
            peer.send("receive_header_then_die", specs=specs, bucket_size_bytes=1 << 16, version=7)
            started = time.monotonic()
            failed_step = r"rank 0 of 2: (bucket \d+/\d+|the receipt) of version 7 failed"
            with pytest.raises(WeightSyncError, match=failed_step):
                sender.push(trainer.named_parameters(), version=7)
            assert time.monotonic() - started < spec.timeout_s + MARGIN_S
            # The group is unusable now, and says so instead of hanging on the next push.
            with pytest.raises(WeightSyncError, match="broken by an earlier failure"):
                sender.push(trainer.named_parameters(), version=8)
        peer.process.join(5)
        assert peer.process.exitcode == 3
    finally:
        peer.stop()


def test_a_generator_that_stops_receiving_fails_the_push_at_the_timeout(peers: list[Peer]) -> None:
    trainer = make_model(seed=0, big_numel=1 << 20)
    spec = _spec(world_size=2, timeout_s=1.5)
    peers[0].send("open", spec=spec, rank=1)
    with open_sync_group(spec, rank=0) as group:
        peers[0].result()
        sender = WeightSender(group, param_specs(trainer.named_parameters()), bucket_size_bytes=1 << 16)
        started = time.monotonic()  # the peer is alive but never calls receive
        with pytest.raises(WeightSyncError, match=r"rank 0 of 2: .* of version 1 failed after .* \(timeout 1.5 s\)"):
            sender.push(trainer.named_parameters(), version=1)
        assert 1.5 <= time.monotonic() - started < 1.5 + MARGIN_S
    peers[0].call("close")


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"world_size": 1}, "needs rank 0 and at least one generator"),
        ({"port": 0}, "port=0"),
        ({"backend": "mpi"}, "expected 'gloo' or 'nccl'"),
        ({"timeout_s": 0.0}, "timeout_s=0.0"),
    ],
)
def test_a_bad_spec_is_rejected_naming_the_field(kwargs: dict, message: str) -> None:
    fields = {"host": "127.0.0.1", "port": 1234, "world_size": 2, "backend": "gloo", "timeout_s": 1.0} | kwargs
    with pytest.raises(ValueError, match=message):
        SyncGroupSpec(**fields)
