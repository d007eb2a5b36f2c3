"""Bucket layout, packing and spec checks, in-process: hand-computed offsets, oversized parameters, bit-exact
round trips over mixed dtypes, and errors that name both sides of a mismatch."""

import pytest
import torch

from asyncppo.distributed.buckets import (
    ParamSpec,
    check_param_specs,
    layout_id,
    pack_bucket,
    param_specs,
    plan_buckets,
    unpack_bucket,
)


def _spec(name: str, numel: int, dtype: torch.dtype = torch.float32) -> ParamSpec:
    return ParamSpec(name, (numel,), dtype)


def _stale_buffer(nbytes: int) -> torch.Tensor:
    return torch.full((nbytes,), 0xFF, dtype=torch.uint8)


def test_parameters_fill_buckets_in_order_at_16_byte_aligned_offsets() -> None:
    # a: 5 fp32 = 20 bytes at 0; b: 3 bf16 = 6 bytes at round_up(20, 16) = 32 (ends 38);
    # c: 4 fp32 = 16 bytes would start at 48 and end at 64 > 60, so it opens bucket 2 at offset 0.
    specs = [_spec("a", 5), _spec("b", 3, torch.bfloat16), _spec("c", 4)]
    buckets = plan_buckets(specs, bucket_size_bytes=60)
    assert [[(slot.spec.name, slot.offset) for slot in bucket.slots] for bucket in buckets] == [
        [("a", 0), ("b", 32)],
        [("c", 0)],
    ]
    assert [bucket.nbytes for bucket in buckets] == [38, 16]


def test_a_parameter_larger_than_a_bucket_gets_a_bucket_of_its_own() -> None:
    specs = [_spec("small", 2), _spec("huge", 100), _spec("after", 2)]
    buckets = plan_buckets(specs, bucket_size_bytes=64)
    assert [[slot.spec.name for slot in bucket.slots] for bucket in buckets] == [["small"], ["huge"], ["after"]]
    assert buckets[1].nbytes == 400


def test_pack_then_unpack_returns_the_exact_bits_of_every_dtype_and_shape() -> None:
    source = torch.randn(6, 4)
    named = [
        ("fp32", source),
        ("bf16", torch.randn(7).bfloat16()),
        ("transposed", source.t()),  # a non-contiguous source is gathered by the copy
        ("int64", torch.tensor([-(2**62), 3, 2**62])),
        ("mask", torch.tensor([True, False, True])),
        ("scalar", torch.tensor(2.5, dtype=torch.float64)),
        ("empty", torch.empty(0, 3)),
        ("negative_zero", torch.tensor([-0.0, float("nan"), float("inf")])),
    ]
    buckets = plan_buckets(param_specs(named), bucket_size_bytes=64)
    tensors = iter(named)
    # Oversized buffers full of stale bytes, as the sender's reused buffers are.
    packed = [(bucket, pack_bucket(bucket, tensors, _stale_buffer(bucket.nbytes + 32))) for bucket in buckets]
    assert [data.numel() for _, data in packed] == [bucket.nbytes for bucket in buckets]
    unpacked = [pair for bucket, data in packed for pair in unpack_bucket(bucket, data)]
    assert [name for name, _ in unpacked] == [name for name, _ in named]
    for (_, sent), (_, got) in zip(named, unpacked, strict=True):
        assert got.dtype == sent.dtype and got.shape == sent.shape
        # Compare bit patterns: torch.equal would call nan != nan.
        assert torch.equal(got.reshape(-1).view(torch.uint8), sent.contiguous().reshape(-1).view(torch.uint8))


def test_packing_casts_to_the_wire_dtype_of_the_spec() -> None:
    weight = torch.randn(10)
    specs = param_specs([("w", weight)], dtype=torch.bfloat16)
    (bucket,) = plan_buckets(specs, bucket_size_bytes=1024)
    ((_, got),) = unpack_bucket(bucket, pack_bucket(bucket, iter([("w", weight)]), _stale_buffer(bucket.nbytes)))
    assert got.dtype == torch.bfloat16 and torch.equal(got, weight.bfloat16())


def test_packing_rejects_parameters_out_of_spec_order_or_shape() -> None:
    specs = [_spec("a", 2), _spec("b", 2)]
    (bucket,) = plan_buckets(specs, bucket_size_bytes=1024)
    with pytest.raises(ValueError, match=r"expected parameter a next .* got b"):
        pack_bucket(bucket, iter([("b", torch.zeros(2)), ("a", torch.zeros(2))]), _stale_buffer(bucket.nbytes))
    with pytest.raises(ValueError, match=r"a has shape \[3\], its spec says \[2\]"):
        pack_bucket(bucket, iter([("a", torch.zeros(3))]), _stale_buffer(bucket.nbytes))
    with pytest.raises(ValueError, match=r"expected parameter b next .* got None"):
        pack_bucket(bucket, iter([("a", torch.zeros(2))]), _stale_buffer(bucket.nbytes))


def test_a_spec_mismatch_names_the_parameter_and_both_specs() -> None:
    trainer = [_spec("embed", 8), ParamSpec("head", (4, 2), torch.bfloat16)]
    generator = [_spec("embed", 8), ParamSpec("head", (4, 2), torch.float32)]
    check_param_specs(trainer, list(trainer))
    with pytest.raises(
        ValueError,
        match=r"parameter 1: the trainer sends head \[4, 2\] torch.bfloat16, this model has "
        r"head \[4, 2\] torch.float32",
    ):
        check_param_specs(trainer, generator)
    with pytest.raises(ValueError, match=r"trainer sends 2 parameters, this model has 1 \(first unmatched: head\)"):
        check_param_specs(trainer, trainer[:1])


def test_the_layout_id_changes_with_the_bucket_size_and_the_dtypes() -> None:
    specs = [_spec("a", 10), _spec("b", 10)]
    assert layout_id(plan_buckets(specs, 1024)) == layout_id(plan_buckets(list(specs), 1024))
    assert layout_id(plan_buckets(specs, 1024)) != layout_id(plan_buckets(specs, 48))
    as_bf16 = [ParamSpec(spec.name, spec.shape, torch.bfloat16) for spec in specs]
    assert layout_id(plan_buckets(specs, 1024)) != layout_id(plan_buckets(as_bf16, 1024))
