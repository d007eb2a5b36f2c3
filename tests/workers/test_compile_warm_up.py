"""The start-up warm-up of compiled layers compiles every graph a PPO step calls and changes nothing a step reads.

The layers compile with the "aot_eager" backend on CPU (the same graphs inductor would get, without code
generation); the workers are built eager and their layers compiled afterwards, as a CUDA worker's would be.
"""

import dataclasses
from collections.abc import Callable

import torch
from torch._dynamo.utils import counters
from worker_fakes import make_batch, weights_of, with_old_logprobs

from asyncppo.models.compiled_layers import compile_decoder_layers
from asyncppo.workers.policy_worker import PolicyWorker
from asyncppo.workers.value_worker import ValueWorker

LENGTHS = [9, 4, 13, 6, 11]


def _compiled(worker: PolicyWorker | ValueWorker) -> None:
    """Compile the worker's layers (and its reference's) with aot_eager and switch its settings to compile."""
    for scoring in worker._scoring_models():
        compile_decoder_layers(scoring.model, backend="aot_eager")
    worker.settings = dataclasses.replace(worker.settings, compile=True)


def test_eager_workers_skip_the_warm_up(make_value: Callable[..., ValueWorker]) -> None:
    assert make_value().warm_up_compiled_layers() == 0.0


def test_warm_up_compiles_every_graph_of_a_policy_step_and_changes_nothing(
    make_policy: Callable[..., PolicyWorker],
) -> None:
    worker = make_policy(keep_reference=True, max_tokens_per_microbatch=48)
    _compiled(worker)
    torch._dynamo.reset()
    counters.clear()
    weights, rng = weights_of(worker.model), torch.get_rng_state()

    assert worker.warm_up_compiled_layers() > 0.0

    compiled_graphs = counters["stats"]["unique_graphs"]
    assert compiled_graphs == 2  # training (forward and backward), and scoring without grad (the reference's too)
    assert all(parameter.grad is None for parameter in worker.model.parameters())
    assert not worker.optimizer.state
    assert not worker.model.training
    assert torch.equal(torch.get_rng_state(), rng)
    assert all(torch.equal(tensor, weights[name]) for name, tensor in worker.model.state_dict().items())

    batch = with_old_logprobs(worker, make_batch(LENGTHS))
    worker.reference_logprobs(batch)
    worker.train(batch)
    assert counters["stats"]["unique_graphs"] == compiled_graphs, "the step compiled a graph the warm-up had not"


def test_warm_up_covers_the_critic_step(make_value: Callable[..., ValueWorker]) -> None:
    worker = make_value(max_tokens_per_microbatch=48)
    _compiled(worker)
    torch._dynamo.reset()
    counters.clear()
    weights = weights_of(worker.model)

    assert worker.warm_up_compiled_layers() > 0.0

    compiled_graphs = counters["stats"]["unique_graphs"]
    assert all(torch.equal(tensor, weights[name]) for name, tensor in worker.model.state_dict().items())
    batch = make_batch(LENGTHS)
    worker.train(batch.with_fields(values=worker.values(batch)))
    assert counters["stats"]["unique_graphs"] == compiled_graphs, "the step compiled a graph the warm-up had not"
