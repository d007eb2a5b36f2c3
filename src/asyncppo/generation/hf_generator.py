"""HFGenerator: the `hf` backend of the Generator protocol, a transformers causal LM decoded batch by batch.

Built by `engines.build_engine` (the generation workers, the CLI) and tests; the rollout code and the policy
server submit to it concurrently. The queue, pausing and closing are the ServingFront's; HFCore decodes.

    submit() --> ServingFront --> turn: admit <= max_batch_size requests --> HFCore.step: decode_batch --> futures

Requests with different SamplingParams share a batch (sampling settings are per row). Weights change only between
batches (the front's core lock covers a whole batch), so a batch never sees two weight versions.
"""

import contextlib
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, replace

import torch
from torch import nn
from torch.nn.attention import sdpa_kernel
from transformers import PreTrainedModel

from asyncppo.generation.engine_settings import EngineSettings
from asyncppo.generation.hf_decoding import decode_batch
from asyncppo.generation.protocol import GenerationRequest, GenerationResult
from asyncppo.generation.serving_front import ServingFront, Submission, fail_unless_done
from asyncppo.generation.weight_loading import copy_named_tensors, request_problem
from asyncppo.models.backbone import TRAINING_ATTENTION_BACKENDS


@dataclass(frozen=True)
class GeneratorStats:
    """Counters since the engine started (read with `HFGenerator.stats()`)."""

    num_batches: int = 0
    """Batches decoded successfully."""
    num_failed_batches: int = 0
    """Batches whose decode raised (their futures carry the exception)."""
    num_requests: int = 0
    num_generated_tokens: int = 0
    largest_batch_size: int = 0
    decode_seconds: float = 0.0


@contextlib.contextmanager
def _eval_mode(model: nn.Module) -> Iterator[None]:
    """Eval mode inside, each module's own training flag restored after (a colocated trainer shares the model)."""
    modes = [(module, module.training) for module in model.modules()]
    model.eval()
    try:
        yield
    finally:
        for module, training in modes:
            module.training = training


class HFCore:
    """The hf EngineCore: a transformers causal LM already on `device`, decoded by `hf_decoding.decode_batch`.

    A step decodes every admitted request as one batch; the front admits up to max_batch_size between steps.
    `seed` seeds the one sampling generator, so a fixed sequence of batches is reproducible.
    """

    def __init__(
        self,
        model: PreTrainedModel,
        eos_token_ids: Sequence[int],
        pad_token_id: int,
        max_batch_size: int,
        device: str | torch.device,
        seed: int,
        max_context_length: int,
        policy_version: int,
    ) -> None:
        if not eos_token_ids:
            raise ValueError("eos_token_ids must name at least one token id")
        if max_batch_size < 1 or max_context_length < 2:
            raise ValueError(
                f"need max_batch_size >= 1 and max_context_length >= 2, got {max_batch_size}, {max_context_length}"
            )
        wanted, model_device = torch.device(device), next(model.parameters()).device
        # "cuda" names whichever GPU is current, so only an explicit index has to match.
        if model_device.type != wanted.type or wanted.index not in (None, model_device.index):
            raise ValueError(f"the model is on {model_device}, not on device={wanted}; move it first")
        self._device = model_device
        self._model = model
        self._eos_token_ids = frozenset(eos_token_ids)
        self._pad_token_id = pad_token_id
        self._max_batch_size = max_batch_size
        self._max_context_length = max_context_length
        embedding_weight = model.get_input_embeddings().weight
        assert isinstance(embedding_weight, torch.Tensor)
        self._vocab_size = int(embedding_weight.shape[0])  # ids at or past it would crash the embedding lookup
        if not 0 <= pad_token_id < self._vocab_size:
            raise ValueError(f"pad_token_id={pad_token_id} is outside the vocabulary [0, {self._vocab_size})")
        self._sampling_generator = torch.Generator(device=self._device).manual_seed(seed)
        self._policy_version = policy_version
        self._batch: list[Submission] = []
        self._stats = GeneratorStats()
        self._stats_lock = threading.Lock()  # stats() answers during a batch, without the front's core lock

    def stats(self) -> GeneratorStats:
        """A snapshot of the counters."""
        with self._stats_lock:
            return self._stats

    def request_problem(self, request: GenerationRequest) -> str | None:
        return request_problem(request, self._max_context_length, self._vocab_size)

    def admission_limit(self) -> int | None:
        return self._max_batch_size - len(self._batch)

    def admit(self, submissions: Sequence[Submission]) -> None:
        # Started at once: the batch runs in the next step, so a cancel after this point would come too late.
        self._batch.extend(s for s in submissions if s[1].set_running_or_notify_cancel())

    def has_work(self) -> bool:
        return bool(self._batch)

    def step(self) -> None:
        """Decode the admitted batch and resolve its futures."""
        start = time.perf_counter()
        # Attention kernels chosen explicitly, as the trainer does (see models.backbone): never cuDNN's per-shape
        # graph builds, which every new padding mask or batch size would trigger.
        with (
            _eval_mode(self._model),
            torch.inference_mode(),
            sdpa_kernel(TRAINING_ATTENTION_BACKENDS, set_priority=True),
        ):
            decoded = decode_batch(
                self._model,
                [request for request, _ in self._batch],
                eos_token_ids=self._eos_token_ids,
                pad_token_id=self._pad_token_id,
                max_context_length=self._max_context_length,
                device=self._device,
                generator=self._sampling_generator,
            )
        batch, self._batch = self._batch, []
        # Counters first, so a caller woken by its result already sees its batch counted.
        with self._stats_lock:
            stats = self._stats
            self._stats = replace(
                stats,
                num_batches=stats.num_batches + 1,
                num_requests=stats.num_requests + len(batch),
                num_generated_tokens=stats.num_generated_tokens + sum(len(s.token_ids) for s in decoded),
                largest_batch_size=max(stats.largest_batch_size, len(batch)),
                decode_seconds=stats.decode_seconds + time.perf_counter() - start,
            )
        for (_, future), sequence in zip(batch, decoded, strict=True):
            # Weights only change between batches, so the first and the last token share the version.
            future.set_result(
                GenerationResult(
                    token_ids=tuple(sequence.token_ids),
                    logprobs=tuple(sequence.logprobs),
                    finish_reason=sequence.finish_reason,
                    policy_version=self._policy_version,
                    last_policy_version=self._policy_version,
                )
            )

    def fail_all(self, error: BaseException) -> None:
        if self._batch:  # a batch whose decode raised (on close the front finds none held)
            with self._stats_lock:
                self._stats = replace(self._stats, num_failed_batches=self._stats.num_failed_batches + 1)
        batch, self._batch = self._batch, []
        for _, future in batch:
            fail_unless_done(future, error)

    def weights_changed(self, version: int, named_tensors: Sequence[tuple[str, torch.Tensor]] | None) -> None:
        # None: a colocated trainer updated this very model in place; there is nothing to copy.
        if named_tensors is not None:
            copy_named_tensors(self._model, named_tensors)
        self._policy_version = version

    def reseed(self, seed: int) -> None:
        self._sampling_generator.manual_seed(seed)

    def counters(self) -> dict[str, float]:
        return {name: float(value) for name, value in asdict(self.stats()).items()}


class HFGenerator(ServingFront):
    """A Generator over a transformers causal LM already on `device` (see HFCore).

    Validation errors (empty prompt, unknown token id, prompt too long for max_context_length) fail the returned
    future at once. An exception inside a batch fails that batch's futures with it; the engine keeps serving.
    """

    def __init__(
        self,
        model: PreTrainedModel,
        eos_token_ids: Sequence[int],
        pad_token_id: int,
        max_batch_size: int,
        device: str | torch.device,
        seed: int,
        max_context_length: int,
        compile: bool = False,
        policy_version: int = 0,
    ) -> None:
        if compile:
            # A static KV cache + torch.compile path for CUDA is future work; the eager loop stays the reference.
            raise NotImplementedError("HFGenerator(compile=True) is not implemented; use compile=False (eager)")
        self._hf = HFCore(
            model, eos_token_ids, pad_token_id, max_batch_size, device, seed, max_context_length, policy_version
        )
        super().__init__("HFGenerator", self._hf, policy_version)

    def stats(self) -> GeneratorStats:
        """A snapshot of the counters (batch sizes show whether concurrent callers share batches)."""
        return self._hf.stats()


def build_hf_generator(model: PreTrainedModel, settings: EngineSettings, seed: int) -> HFGenerator:
    """The hf backend's builder for `engines.BACKENDS`: an HFGenerator on the model's own device."""
    return HFGenerator(
        model,
        eos_token_ids=settings.eos_token_ids,
        pad_token_id=settings.pad_token_id,
        max_batch_size=settings.max_batch_size,
        device=next(model.parameters()).device,
        seed=seed,
        max_context_length=settings.max_context_length,
    )
