"""GraphGenerator: the `graph` backend of the Generator protocol, a GraphEngine behind a serving thread.

Built by the generation workers, `asyncppo gym serve` and `asyncppo bench generate`; the rollout code and the
policy server submit to it concurrently.

    submit() --> RequestQueue --> serving thread: engine.step() in a loop (continuous batching) --> futures

Weights change only between steps: the serving thread holds `_model_lock` for one step, and `load_weights` /
`set_policy_version` take the same lock. pause() stops at the next step boundary with running rows frozen in
their slots; after new weights a row continues on them (its result then records the first and the last
version), or recomputes its KV first when the engine is set to.
"""

import threading
from collections.abc import Iterable
from dataclasses import replace

import torch
from transformers import PreTrainedModel

from asyncppo.generation.graph_engine import GraphEngine, GraphEngineStats
from asyncppo.generation.graph_settings import GraphEngineSettings
from asyncppo.generation.protocol import GeneratorClosedError
from asyncppo.generation.request_queue import QueuedSubmission, RequestQueue
from asyncppo.generation.weight_loading import copy_named_tensors, request_problem


class GraphGenerator(QueuedSubmission):
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
        self._model_lock = threading.Lock()  # held for one engine step, and by weight / version changes
        self._num_failed_steps = 0
        self._requests = RequestQueue(
            "GraphGenerator",
            "graph-generator",
            lambda request: request_problem(request, settings.max_context_length, self._engine.vocab_size),
            self._serve_one_step,
            has_other_work=lambda: self._engine.has_work,
            on_death=self._engine.fail_all,
        )
        self._requests.start()

    @property
    def policy_version(self) -> int:
        return self._engine.policy_version

    def stats(self) -> GraphEngineStats:
        """A snapshot of the engine's counters."""
        with self._model_lock:
            return replace(self._engine.stats)

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
            self._drain_queue()  # earlier submissions keep seeds of the old sequence
            self._engine.reseed(seed)

    def close(self) -> None:
        """Fail queued requests with GeneratorClosedError, finish the running step, stop the thread."""
        self._requests.close()
        with self._model_lock:
            self._engine.fail_all(GeneratorClosedError("GraphGenerator was closed while this request ran"))

    def _drain_queue(self) -> None:
        """Move submitted requests into the engine (caller holds _model_lock)."""
        for request, future in self._requests.take():
            self._engine.add(request, future)

    def _serve_one_step(self) -> None:
        """The serving thread's turn: admit what was submitted, then one engine step."""
        with self._model_lock, torch.inference_mode():
            self._drain_queue()
            self._step()

    def _step(self) -> None:
        try:
            self._engine.step()
        except Exception as error:  # fault isolation is the point: the step's requests fail, the engine serves on
            self._num_failed_steps += 1
            self._engine.fail_all(error)
