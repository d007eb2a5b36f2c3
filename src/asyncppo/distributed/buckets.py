"""The bucket layout of a weight transfer: parameters packed into flat uint8 buckets, unpacked as typed views.

Transport-free: `weight_sync.py` broadcasts these buckets over the sync group, and a same-GPU path (CUDA IPC
handles of the same buckets) can reuse the layout unchanged. Both ends derive the layout from the same
`ParamSpec` list (exchanged once at setup) and the same bucket size, so only raw bytes ever travel.

    [(name, tensor)] --pack_bucket--> bucket k: uint8 | p0 | pad | p1 | pad | ... | --unpack_bucket--> [(name, view)]
"""

import hashlib
import math
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass

import torch

# Every parameter starts 16-byte aligned: a typed view of a uint8 buffer needs offset % itemsize == 0, and 16
# bytes also keeps vectorised GPU copies out of and into the bucket aligned. Padding costs < 16 bytes/parameter.
ALIGN_BYTES = 16


@dataclass(frozen=True)
class ParamSpec:
    """Name, shape and wire dtype of one parameter; the trainer's list is handed to every generator at setup."""

    name: str
    shape: tuple[int, ...]
    dtype: torch.dtype

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        return self.numel * self.dtype.itemsize


@dataclass(frozen=True)
class Slot:
    """Where one parameter sits inside its bucket."""

    spec: ParamSpec
    offset: int


@dataclass(frozen=True)
class Bucket:
    """One flat uint8 buffer's worth of parameters, in spec order."""

    slots: tuple[Slot, ...]
    nbytes: int


def param_specs(named_tensors: Iterable[tuple[str, torch.Tensor]], dtype: torch.dtype | None = None) -> list[ParamSpec]:
    """Specs of `named_tensors` in order; `dtype` overrides the wire dtype (e.g. send fp32 master weights as bf16)."""
    return [ParamSpec(name, tuple(tensor.shape), dtype or tensor.dtype) for name, tensor in named_tensors]


def check_param_specs(expected: Sequence[ParamSpec], actual: Sequence[ParamSpec]) -> None:
    """Raise ValueError naming the first parameter where the trainer's specs (`expected`) and this model's differ."""
    for index, (sent, own) in enumerate(zip(expected, actual, strict=False)):
        if sent != own:
            raise ValueError(
                f"weight spec mismatch at parameter {index}: the trainer sends {sent.name} {list(sent.shape)} "
                f"{sent.dtype}, this model has {own.name} {list(own.shape)} {own.dtype}"
            )
    if len(expected) != len(actual):
        first_extra = expected[len(actual)] if len(expected) > len(actual) else actual[len(expected)]
        raise ValueError(
            f"weight spec mismatch: the trainer sends {len(expected)} parameters, this model has {len(actual)} "
            f"(first unmatched: {first_extra.name})"
        )


def plan_buckets(specs: Sequence[ParamSpec], bucket_size_bytes: int) -> list[Bucket]:
    """Greedy layout in spec order: fill a bucket up to `bucket_size_bytes`; a larger parameter gets its own."""
    if bucket_size_bytes < ALIGN_BYTES:
        raise ValueError(f"bucket_size_bytes={bucket_size_bytes} must be >= {ALIGN_BYTES}")
    buckets: list[Bucket] = []
    slots: list[Slot] = []
    end = 0
    for spec in specs:
        offset = _round_up(end, ALIGN_BYTES)
        if slots and offset + spec.nbytes > bucket_size_bytes:
            buckets.append(Bucket(tuple(slots), end))
            slots, offset = [], 0
        slots.append(Slot(spec, offset))
        end = offset + spec.nbytes
    if slots:
        buckets.append(Bucket(tuple(slots), end))
    return buckets


def layout_id(buckets: Sequence[Bucket]) -> int:
    """A 62-bit fingerprint of the layout (names, shapes, dtypes, offsets); sent in the header so ends agree."""
    text = "\n".join(
        f"{k} {slot.offset} {slot.spec.name} {list(slot.spec.shape)} {slot.spec.dtype}"
        for k, bucket in enumerate(buckets)
        for slot in bucket.slots
    )
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "little") >> 2


def slot_view(data: torch.Tensor, slot: Slot) -> torch.Tensor:
    """The parameter of `slot` as a typed view into the bucket `data` (uint8); no copy."""
    spec = slot.spec
    return data[slot.offset : slot.offset + spec.nbytes].view(spec.dtype).view(spec.shape)


def pack_bucket(
    bucket: Bucket, named_tensors: Iterator[tuple[str, torch.Tensor]], buffer: torch.Tensor
) -> torch.Tensor:
    """Take the bucket's parameters from `named_tensors` (spec order) and copy them, cast, into `buffer`.

    `buffer` is uint8 with at least `bucket.nbytes` elements; returns its first `bucket.nbytes` (padding unset).
    """
    data = buffer[: bucket.nbytes]
    for slot in bucket.slots:
        spec = slot.spec
        name, tensor = next(named_tensors, (None, None))
        if name != spec.name or tensor is None:
            raise ValueError(f"weight push expected parameter {spec.name} next (spec order), got {name}")
        if tuple(tensor.shape) != spec.shape:
            raise ValueError(f"weight push: {name} has shape {list(tensor.shape)}, its spec says {list(spec.shape)}")
        # One copy does the cast, the device move and the gather of a non-contiguous source.
        slot_view(data, slot).copy_(tensor.detach())
    return data


def unpack_bucket(bucket: Bucket, data: torch.Tensor) -> list[tuple[str, torch.Tensor]]:
    """(name, view) for every parameter of the bucket; views share `data`, so the caller copies what it keeps."""
    return [(slot.spec.name, slot_view(data, slot)) for slot in bucket.slots]


def _round_up(value: int, multiple: int) -> int:
    return (value + multiple - 1) // multiple * multiple
