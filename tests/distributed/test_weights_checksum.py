"""The weights checksum: bit-level (one flipped bit of one element changes it), equal for identical bits whatever
the memory layout or tensor order, and its per-tensor digest equal to a pure-Python sum mod 2^64."""

import pytest
import torch

from asyncppo.distributed import weight_sync
from asyncppo.distributed.process_group import WeightSyncError
from asyncppo.distributed.weight_sync import check_checksums, tensor_digest, weights_checksum

_INT_VIEW = {torch.float32: torch.int32, torch.bfloat16: torch.int16, torch.float64: torch.int64}


def _weights() -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    return {
        "layer.weight": torch.randn(33, 17, generator=generator),
        "layer.bias": torch.randn(17, generator=generator).bfloat16(),
        "scale": torch.randn(5, generator=generator, dtype=torch.float64),
    }


def _flip_bit(tensor: torch.Tensor, index: int, bit: int) -> torch.Tensor:
    flipped = tensor.clone()
    words = flipped.reshape(-1).view(_INT_VIEW[tensor.dtype])
    words[index] ^= torch.tensor(1, dtype=words.dtype) << bit  # bit 15/31/63 is the sign bit
    return flipped


@pytest.mark.parametrize("name", ["layer.weight", "layer.bias", "scale"])
def test_flipping_any_one_bit_of_one_element_changes_the_checksum(name: str) -> None:
    weights = _weights()
    reference = weights_checksum(weights.items())
    width = weights[name].element_size() * 8
    for index, bit in [(0, 0), (3, width // 2), (weights[name].numel() - 1, width - 1)]:
        changed = dict(weights, **{name: _flip_bit(weights[name], index, bit)})
        assert weights_checksum(changed.items()) != reference, (name, index, bit)


def test_identical_bits_give_the_same_checksum_whatever_the_layout_or_order() -> None:
    weights = _weights()
    reference = weights_checksum(weights.items())
    transposed_copy = weights["layer.weight"].t().contiguous().t()  # same values, column-major memory
    assert not transposed_copy.is_contiguous()
    rebuilt = {"scale": weights["scale"].clone(), "layer.bias": weights["layer.bias"].clone()}
    rebuilt["layer.weight"] = transposed_copy
    assert weights_checksum(rebuilt.items()) == reference


def test_the_checksum_is_bit_level_not_value_level() -> None:
    # -0.0 == 0.0 as values, but a generator holding the other one did not receive the trainer's bits.
    assert weights_checksum([("w", torch.tensor([0.0]))]) != weights_checksum([("w", torch.tensor([-0.0]))])


def test_renaming_or_reshaping_a_tensor_changes_the_checksum() -> None:
    weight = torch.randn(4, 6)
    reference = weights_checksum([("w", weight)])
    assert weights_checksum([("v", weight)]) != reference
    assert weights_checksum([("w", weight.reshape(6, 4))]) != reference


def test_the_digest_equals_the_sum_mod_2_to_the_64_computed_in_python(monkeypatch: pytest.MonkeyPatch) -> None:
    # A 7-element chunk exercises the chunk-offset term; fp64 words near 2^63 make every product wrap around.
    monkeypatch.setattr(weight_sync, "_CHUNK_ELEMENTS_CPU", 7)
    tensor = torch.randn(30, dtype=torch.float64) * 1e300
    words = tensor.view(torch.int64).tolist()
    multiplier, offset = weight_sync._MULTIPLIER, weight_sync._OFFSET
    expected = sum(word * (2 * multiplier * i + 2 * offset + 1) for i, word in enumerate(words)) % 2**64
    assert int(tensor_digest(tensor)) % 2**64 == expected


def test_check_checksums_names_every_mismatching_rank() -> None:
    check_checksums("abc", {1: "abc", 2: "abc"}, version=4)
    with pytest.raises(WeightSyncError, match="version 4: the trainer sent abc, rank 2 has xyz, rank 3 has stale"):
        check_checksums("abc", {1: "abc", 3: "stale", 2: "xyz"}, version=4)
    with pytest.raises(ValueError, match="no generator checksums"):
        check_checksums("abc", {}, version=4)
