"""GraphGenerator: the `graph` backend of the Generator protocol, a GraphEngine behind a serving thread.

Built by the generation workers, `asyncppo gym serve` and `asyncppo bench generate`; the rollout code and the
policy server submit to it concurrently.

    submit() --> inbox --> serving thread: engine.step() in a loop (continuous batching) --> futures

Weights change only between steps: the serving thread holds `_model_lock` for one step, and `load_weights` /
`set_policy_version` take the same lock. pause() stops at the next step boundary with running rows frozen in
their slots; after new weights a row continues on them (its result then records the first and the last
version), or recomputes its KV first when the engine is set to.
"""

import threading
from collections import deque
from collections.abc import Iterable, Sequence
from concurrent.futures import Future
from dataclasses import replace

import torch
from transformers import PreTrainedModel

from asyncppo.generation.graph_engine import GraphEngine, GraphEngineSettings, GraphEngineStats
from asyncppo.generation.protocol import GenerationRequest, GenerationResult, GeneratorClosedError
from asyncppo.generation.weight_loading import copy_named_tensors, request_problem


class GraphGenerator:
    """A Generator over a Llama / Qwen2 / Qwen3 / Mistral model already on its device (see `decoder_weights`).

    The model is the source of weights: the engine copies them at start, after `load_weights` (which writes
    into the model first) and on `set_policy_version` (a colocated trainer updated the model in place).
    A failed step fails the requests it held with its exception; the engine keeps serving.
    """

    def __init__(self, model: PreTrainedModel, settings: GraphEngineSettings, policy_version: int = 0):
        if settings.max_batch_size < 1 or settings.max_context_length < 2:
            raise ValueError(
                f"need max_batch_size >= 1 and max_context_length >= 2, got {settings.max_batch_size}, "
                f"{settings.max_context_length}"
            )
        if not settings.eos_token_ids:
            raise ValueError("eos_token_ids must name at least one token id")
        self._model = model
        with torch.inference_mode():
            self._engine = GraphEngine(model, settings, policy_version)
        self._max_context_length = settings.max_context_length
        self._model_lock = threading.Lock()  # held for one engine step, and by weight / version changes
        self._state = threading.Condition()  # guards the fields below
        self._inbox: deque[tuple[GenerationRequest, Future[GenerationResult]]] = deque()
        self._paused = False
        self._busy = False
        self._closed = False
        self._num_failed_steps = 0
        self._thread = threading.Thread(target=self._serve, name="graph-generator", daemon=True)
        self._thread.start()

    @property
    def policy_version(self) -> int:
        return self._engine.policy_version

    def stats(self) -> GraphEngineStats:
        """A snapshot of the engine's counters."""
        with self._model_lock:
            return replace(self._engine.stats)

    def submit(self, request: GenerationRequest) -> "Future[GenerationResult]":
        """Queue one request; the future carries its result, a validation error or GeneratorClosedError."""
        return self.submit_many([request])[0]

    def submit_many(self, requests: Sequence[GenerationRequest]) -> "list[Future[GenerationResult]]":
        """Queue several requests at once, in order (their derived seeds follow this order)."""
        futures: list[Future[GenerationResult]] = []
        accepted: list[tuple[GenerationRequest, Future[GenerationResult]]] = []
        for request in requests:
            futures.append(Future())
            if problem := request_problem(request, self._max_context_length, self._engine.vocab_size):
                futures[-1].set_exception(ValueError(problem))
            else:
                accepted.append((request, futures[-1]))
        with self._state:
            if self._closed:
                for _, future in accepted:
                    future.set_exception(GeneratorClosedError("GraphGenerator is closed; no new requests are served"))
                return futures
            self._inbox.extend(accepted)
            self._state.notify_all()
        return futures

    def generate(self, requests: Sequence[GenerationRequest]) -> list[GenerationResult]:
        """Queue all requests together and wait; results are in request order."""
        return [future.result() for future in self.submit_many(requests)]

    def pause(self) -> None:
        """Start no new step and return at the next step boundary; running rows stay in their slots."""
        with self._state:
            self._paused = True
            self._state.wait_for(lambda: not self._busy)

    def resume(self) -> None:
        with self._state:
            self._paused = False
            self._state.notify_all()

    def load_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]], version: int) -> None:
        """Copy a full set of parameters into the model by name, then into the engine, and set the version.

        Checked completely before anything is copied (a rejected update changes nothing). Safe at any time:
        it waits for the running step.
        """
        received = list(named_tensors)
        with self._model_lock, torch.inference_mode():
            copy_named_tensors(self._model, received)
            self._engine.weights_changed(version, self._model)

    def set_policy_version(self, version: int) -> None:
        """The model's weights changed in place (colocated trainer): copy them into the engine, set the version."""
        with self._model_lock, torch.inference_mode():
            self._engine.weights_changed(version, self._model)

    def reseed(self, seed: int) -> None:
        """Derive the seeds of requests submitted from now on from `seed`, e.g. once per training step."""
        with self._model_lock:
            self._drain_inbox()  # earlier submissions keep seeds of the old sequence
            self._engine.reseed(seed)

    def close(self) -> None:
        """Fail queued requests with GeneratorClosedError, finish the running step, stop the thread."""
        with self._state:
            self._closed = True
            pending = list(self._inbox)
            self._inbox.clear()
            self._state.notify_all()
        for _, future in pending:
            future.set_exception(GeneratorClosedError("GraphGenerator was closed before this request ran"))
        if threading.current_thread() is not self._thread:
            self._thread.join()
        with self._model_lock:
            self._engine.fail_all(GeneratorClosedError("GraphGenerator was closed while this request ran"))

    def _drain_inbox(self) -> None:
        """Move submitted requests into the engine (caller holds _model_lock)."""
        with self._state:
            arrivals = list(self._inbox)
            self._inbox.clear()
        for request, future in arrivals:
            self._engine.add(request, future)

    def _serve(self) -> None:
        try:
            self._serve_until_closed()
        except BaseException as error:
            # Only a bug in the loop itself gets here (step errors are handled per step). Close the engine so
            # that no caller waits on a thread that is gone.
            with self._state:
                self._closed = True
                pending = list(self._inbox)
                self._inbox.clear()
            for _, future in pending:
                future.set_exception(GeneratorClosedError(f"the GraphGenerator serving thread died: {error!r}"))
            self._engine.fail_all(GeneratorClosedError(f"the GraphGenerator serving thread died: {error!r}"))
            raise

    def _serve_until_closed(self) -> None:
        while True:
            with self._state:
                self._state.wait_for(
                    lambda: self._closed or (not self._paused and (bool(self._inbox) or self._engine.has_work))
                )
                if self._closed:
                    return
                self._busy = True
            try:
                with self._model_lock, torch.inference_mode():
                    self._drain_inbox()
                    self._step()
            finally:
                with self._state:
                    self._busy = False
                    self._state.notify_all()

    def _step(self) -> None:
        try:
            self._engine.step()
        except Exception as error:  # fault isolation is the point: the step's requests fail, the engine serves on
            self._num_failed_steps += 1
            self._engine.fail_all(error)
