"""HFGenerator: the `hf` backend of the Generator protocol, a transformers causal LM behind a batching thread.

Built by the generation workers and tests; the rollout code and the policy server submit to it concurrently.

    submit() --> RequestQueue --> serving thread: take <= max_batch_size requests --> decode_batch --> futures

Requests with different SamplingParams share a batch (sampling settings are per row). Weights change only
between batches: the serving thread holds `_model_lock` for a whole batch, and `load_weights` /
`set_policy_version` take the same lock, so a batch never sees two weight versions.
"""

import contextlib
import threading
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, replace

import torch
from torch import nn
from torch.nn.attention import sdpa_kernel
from transformers import PreTrainedModel

from asyncppo.generation.hf_decoding import decode_batch
from asyncppo.generation.protocol import GenerationResult
from asyncppo.generation.request_queue import QueuedSubmission, RequestQueue, Submission
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


class HFGenerator(QueuedSubmission):
    """A Generator over a transformers causal LM already on `device`, decoded by `hf_decoding.decode_batch`.

    Validation errors (empty prompt, unknown token id, prompt too long for max_context_length) fail the
    returned future at once. An exception inside a batch fails that batch's futures with it; the engine
    keeps serving. `seed` seeds the one sampling generator, so a fixed sequence of batches is reproducible.
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
        self._stats = GeneratorStats()

        self._model_lock = threading.Lock()  # held for a whole batch, and by weight / version changes
        self._stats_lock = threading.Lock()
        self._requests = RequestQueue(
            "HFGenerator",
            "hf-generator",
            lambda request: request_problem(request, self._max_context_length, self._vocab_size),
            self._serve_one_batch,
        )
        self._requests.start()

    @property
    def policy_version(self) -> int:
        """Version of the weights currently loaded."""
        return self._policy_version

    def stats(self) -> GeneratorStats:
        """A snapshot of the counters (batch sizes show whether concurrent callers share batches)."""
        with self._stats_lock:
            return self._stats

    def load_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]], version: int) -> None:
        """Copy a full set of parameters in by name and set the version, between batches (waits for a running one).

        Everything is checked before anything is copied (see `check_named_tensors`), so a rejected update
        leaves the old weights and version in place. Values are cast to each parameter's dtype and device.
        Safe at any time (it takes the batch lock); the weight sync calls pause(), load_weights(), resume() so
        that no batch starts on old weights while the new ones are in transit.
        """
        received = list(named_tensors)
        with self._model_lock:
            copy_named_tensors(self._model, received)
            self._policy_version = version

    def set_policy_version(self, version: int) -> None:
        """Set the version without copying (colocated: the trainer updated the shared model in place)."""
        with self._model_lock:
            self._policy_version = version

    def reseed(self, seed: int) -> None:
        """Restart the sampling generator from `seed` (between batches), e.g. once per training step so a resumed
        run draws the same samples as an uninterrupted one without saving generator state."""
        with self._model_lock:
            self._sampling_generator.manual_seed(seed)

    def close(self) -> None:
        """Fail queued requests with GeneratorClosedError, let a running batch finish, stop the thread."""
        self._requests.close()

    def _serve_one_batch(self) -> None:
        """The serving thread's turn: one batch of the oldest requests (those cancelled while queued are skipped)."""
        batch = self._requests.take(self._max_batch_size, start_running=True)
        if batch:
            self._run_batch(batch)

    def _run_batch(self, batch: list[Submission]) -> None:
        start = time.perf_counter()
        try:
            # Attention kernels chosen explicitly, as the trainer does (see models.backbone): never cuDNN's per-shape
            # graph builds, which every new padding mask or batch size would trigger.
            with (
                self._model_lock,
                _eval_mode(self._model),
                torch.inference_mode(),
                sdpa_kernel(TRAINING_ATTENTION_BACKENDS, set_priority=True),
            ):
                version = self._policy_version
                decoded = decode_batch(
                    self._model,
                    [request for request, _ in batch],
                    eos_token_ids=self._eos_token_ids,
                    pad_token_id=self._pad_token_id,
                    max_context_length=self._max_context_length,
                    device=self._device,
                    generator=self._sampling_generator,
                )
        except BaseException as error:  # fault isolation is the point: the batch fails, the engine keeps serving
            with self._stats_lock:
                self._stats = replace(self._stats, num_failed_batches=self._stats.num_failed_batches + 1)
            for _, future in batch:
                future.set_exception(error)
            if not isinstance(error, Exception):
                raise  # SystemExit and the like end the serving thread (see RequestQueue._serve)
            return
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
                    policy_version=version,
                    last_policy_version=version,
                )
            )
