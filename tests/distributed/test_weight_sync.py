"""Weight sync between real processes over gloo: every generator holds the trainer's exact bits after each push
(several buckets, one parameter larger than a bucket, bf16 and fp32), wire-dtype casts, and version and layout
mismatches that fail naming both values."""

import time

import pytest
import torch
from sync_peer import Peer, PeerError, make_model

from asyncppo.distributed.buckets import plan_buckets
from asyncppo.distributed.process_group import SyncGroup, SyncGroupSpec, WeightSyncError, free_port, open_sync_group
from asyncppo.distributed.weight_sync import WeightSender, param_specs, weights_checksum

pytestmark = pytest.mark.integration

BUCKET_SIZE = 1024  # bytes: the small layers span several buckets and the 40 KB 'big' parameter exceeds one
BIG_NUMEL = 10_000


def _open_group(peers: list[Peer], timeout_s: float = 10.0) -> SyncGroup:
    spec = SyncGroupSpec("127.0.0.1", free_port(), 1 + len(peers), "gloo", timeout_s)
    for rank, peer in enumerate(peers, start=1):
        peer.send("open", spec=spec, rank=rank)
    group = open_sync_group(spec, rank=0)
    for peer in peers:
        peer.result()
    return group


def test_every_generator_holds_the_trainers_exact_bits_after_each_push(peers: list[Peer]) -> None:
    trainer = make_model(seed=0, big_numel=BIG_NUMEL)
    specs = param_specs(trainer.named_parameters())
    assert {spec.dtype for spec in specs} == {torch.float32, torch.bfloat16}
    buckets = plan_buckets(specs, BUCKET_SIZE)
    assert len(buckets) >= 4 and any(len(bucket.slots) > 1 for bucket in buckets)
    assert max(bucket.nbytes for bucket in buckets) == BIG_NUMEL * 4 > BUCKET_SIZE
    with _open_group(peers) as group:
        for peer in peers:  # different seeds: a parameter that did not arrive keeps different values
            peer.call("build", seed=1, big_numel=BIG_NUMEL, dtype=torch.float32, trainer_specs=specs)
        sender = WeightSender(group, specs, BUCKET_SIZE)
        for version in (1, 2):
            with torch.no_grad():
                for parameter in trainer.parameters():
                    parameter.mul_(-0.5).add_(version)  # new weights for each version
            for peer in peers:
                peer.send("receive", specs=specs, bucket_size_bytes=BUCKET_SIZE, version=version)
            report = sender.push(trainer.named_parameters(), version)
            expected = weights_checksum(trainer.named_parameters())
            assert (report.version, report.num_buckets) == (version, len(buckets))
            assert report.num_bytes == sum(bucket.nbytes for bucket in buckets) and report.checksum == expected
            for peer in peers:
                weights, checksum = peer.result()
                assert checksum == expected
                for name, parameter in trainer.named_parameters():
                    assert weights[name].dtype == parameter.dtype and torch.equal(weights[name], parameter), name
    with pytest.raises(WeightSyncError, match="on a closed group"):
        group.broadcast(torch.zeros(1), what="a broadcast after close")


def test_an_fp32_trainer_sends_bf16_weights_to_a_bf16_generator(peers: list[Peer]) -> None:
    trainer = make_model(seed=0)
    specs = param_specs(trainer.named_parameters(), dtype=torch.bfloat16)
    with _open_group(peers[:1]) as group:
        peers[0].call("build", seed=1, big_numel=0, dtype=torch.bfloat16, trainer_specs=specs)
        peers[0].send("receive", specs=specs, bucket_size_bytes=BUCKET_SIZE, version=3)
        report = WeightSender(group, specs, BUCKET_SIZE).push(trainer.named_parameters(), version=3)
        weights, checksum = peers[0].result()
    sent = {name: parameter.detach().bfloat16() for name, parameter in trainer.named_parameters()}
    assert checksum == report.checksum == weights_checksum(sent.items())
    assert all(torch.equal(weights[name], tensor) for name, tensor in sent.items())


def test_a_version_mismatch_fails_both_sides_naming_both_versions(peers: list[Peer]) -> None:
    trainer = make_model(seed=0)
    specs = param_specs(trainer.named_parameters())
    with _open_group(peers[:1], timeout_s=3.0) as group:
        peers[0].call("build", seed=0, big_numel=0, dtype=torch.float32, trainer_specs=specs)
        peers[0].send("receive", specs=specs, bucket_size_bytes=BUCKET_SIZE, version=4)
        started = time.monotonic()
        with pytest.raises(WeightSyncError, match=r"rank 0 of 2: .* of version 5 failed"):
            WeightSender(group, specs, BUCKET_SIZE).push(trainer.named_parameters(), version=5)
        assert time.monotonic() - started < 3.0 + 2.0
        with pytest.raises(PeerError, match="rank 1: expected weights version 4, but the trainer sent version 5"):
            peers[0].result()


def test_a_bucket_size_mismatch_fails_the_generator_naming_both_layouts(peers: list[Peer]) -> None:
    trainer = make_model(seed=0)
    specs = param_specs(trainer.named_parameters())
    with _open_group(peers[:1], timeout_s=3.0) as group:
        peers[0].call("build", seed=0, big_numel=0, dtype=torch.float32, trainer_specs=specs)
        peers[0].send("receive", specs=specs, bucket_size_bytes=BUCKET_SIZE * 4, version=1)
        with pytest.raises(WeightSyncError):
            WeightSender(group, specs, BUCKET_SIZE).push(trainer.named_parameters(), version=1)
        layouts = (
            r"the trainer's bucket layout \(\d+ buckets, \d+ bytes, id \d+\) differs from this rank's \(\d+ buckets"
        )
        with pytest.raises(PeerError, match=layouts):
            peers[0].result()


def test_a_generator_with_a_different_model_is_refused_at_setup(peers: list[Peer]) -> None:
    trainer_specs = param_specs(make_model(seed=0, big_numel=BIG_NUMEL).named_parameters())
    with pytest.raises(PeerError, match=r"the trainer sends big \[10000\] torch.float32, this model has 0.weight"):
        peers[0].call("build", seed=0, big_numel=0, dtype=torch.float32, trainer_specs=trainer_specs)


@pytest.mark.gpu
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs: NCCL cannot put two ranks on one GPU")
def test_nccl_moves_exact_bits_between_two_gpus_and_checksums_agree_with_the_cpu(peers: list[Peer]) -> None:
    trainer = make_model(seed=0, big_numel=BIG_NUMEL).to("cuda:0")
    specs = param_specs(trainer.named_parameters())
    spec = SyncGroupSpec("127.0.0.1", free_port(), 2, "nccl", timeout_s=60.0)
    peers[0].send("open", spec=spec, rank=1, device="cuda:1")
    with open_sync_group(spec, rank=0, device=torch.device("cuda:0")) as group:
        peers[0].result()
        peers[0].call("build", seed=1, big_numel=BIG_NUMEL, dtype=torch.float32, trainer_specs=specs, device="cuda:1")
        peers[0].send("receive", specs=specs, bucket_size_bytes=BUCKET_SIZE, version=1)
        report = WeightSender(group, specs, BUCKET_SIZE).push(trainer.named_parameters(), version=1)
        weights, checksum = peers[0].result()
    peers[0].call("close")
    on_cpu = {name: parameter.detach().cpu() for name, parameter in trainer.named_parameters()}
    assert checksum == report.checksum == weights_checksum(on_cpu.items())
    assert all(torch.equal(weights[name], tensor) for name, tensor in on_cpu.items())
