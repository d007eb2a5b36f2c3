"""GraphGenerator: the `graph` backend of the Generator protocol, a GraphEngine stepped behind a ServingFront.

Built by `engines.build_engine` (the generation workers, `asyncppo gym serve`, `asyncppo bench generate`) and tests;
the rollout code and the policy server submit to it concurrently. The queue, pausing and closing are the front's.

    submit() --> ServingFront --> turn: admit every queued request --> GraphCore.step: engine.step() --> futures

Weights change only between steps (the front's core lock covers one step). pause() stops at the next step boundary
with running rows frozen in their slots; after new weights a row continues on them (its result then records the
first and the last version), or recomputes its KV first when the engine is set to.
"""

import dataclasses
from collections.abc import Sequence
from dataclasses import asdict, replace
from typing import Any

import torch
from transformers import PreTrainedModel

from asyncppo.generation.engine_settings import EngineSettings
from asyncppo.generation.graph_engine import GraphEngine, GraphEngineStats
from asyncppo.generation.graph_settings import GraphEngineSettings
from asyncppo.generation.protocol import GenerationRequest
from asyncppo.generation.serving_front import ServingFront, Submission
from asyncppo.generation.weight_loading import copy_named_tensors, request_problem


class GraphCore:
    """The graph EngineCore: a GraphEngine over a Llama / Qwen2 / Qwen3 / Mistral model already on its device.

    The model is the source of weights: the engine copies them at start and on every weights change (after copying
    sent tensors into the model first, or as they are when a colocated trainer updated the model in place). Every
    queued request is admitted at once: the engine's own waiting line orders them into slots.
    """

    def __init__(self, model: PreTrainedModel, settings: GraphEngineSettings, policy_version: int) -> None:
        if settings.max_batch_size < 1 or settings.max_context_length < 2:
            raise ValueError(
                f"need max_batch_size >= 1 and max_context_length >= 2, got {settings.max_batch_size}, "
                f"{settings.max_context_length}"
            )
        if not settings.eos_token_ids:
            raise ValueError("eos_token_ids must name at least one token id")
        self._model = model
        self._max_context_length = settings.max_context_length
        with torch.inference_mode():
            self.engine = GraphEngine(model, settings, policy_version)

    def request_problem(self, request: GenerationRequest) -> str | None:
        return request_problem(request, self._max_context_length, self.engine.vocab_size) or (
            self.engine.stop_ids_problem(request.sampling)
        )

    def admission_limit(self) -> int | None:
        return None

    def admit(self, submissions: Sequence[Submission]) -> None:
        # Left pending: a request waiting for a slot can still be cancelled; the engine starts it when it gets one.
        for request, future in submissions:
            self.engine.add(request, future)

    def has_work(self) -> bool:
        return self.engine.has_work

    def step(self) -> None:
        with torch.inference_mode():
            self.engine.step()

    def fail_all(self, error: BaseException) -> None:
        with torch.inference_mode():
            self.engine.fail_all(error)

    def weights_changed(self, version: int, named_tensors: Sequence[tuple[str, torch.Tensor]] | None) -> None:
        with torch.inference_mode():
            if named_tensors is not None:
                copy_named_tensors(self._model, named_tensors)
            self.engine.weights_changed(version, self._model)

    def reseed(self, seed: int) -> None:
        self.engine.reseed(seed)

    def counters(self) -> dict[str, float]:
        return {name: float(value) for name, value in asdict(self.engine.stats).items()}


class GraphGenerator(ServingFront):
    """A Generator over a GraphEngine (see GraphCore). A failed step fails the requests it held with its exception;
    the engine keeps serving."""

    def __init__(self, model: PreTrainedModel, settings: GraphEngineSettings, policy_version: int = 0) -> None:
        self._graph = GraphCore(model, settings, policy_version)
        super().__init__("GraphGenerator", self._graph, policy_version)

    def stats(self) -> GraphEngineStats:
        """A snapshot of the engine's counters (taken between steps)."""
        with self._core_lock:
            return replace(self._graph.engine.stats)


def graph_engine_settings(settings: EngineSettings, seed: int) -> GraphEngineSettings:
    """The graph engine's settings: every field EngineSettings shares with it by name, the rank's `seed`, and the
    graph engine's own defaults for its scheduler knobs (which EngineSettings does not carry)."""
    shared: dict[str, Any] = {
        field.name: getattr(settings, field.name)
        for field in dataclasses.fields(GraphEngineSettings)
        if hasattr(settings, field.name)
    }
    shared["seed"] = seed
    return GraphEngineSettings(**shared)


def build_graph_generator(model: PreTrainedModel, settings: EngineSettings, seed: int) -> GraphGenerator:
    """The graph backend's builder for `engines.BACKENDS`."""
    return GraphGenerator(model, graph_engine_settings(settings, seed))
