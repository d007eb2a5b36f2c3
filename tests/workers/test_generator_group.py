"""GeneratorGroup routing on two real generator hosts in Ray (graph engines on the tiny model): prompt groups stay
whole on one rank, requests go to the least-loaded rank, results come back in request order, and a dead rank
fails the calls routed to it with an error that names it instead of stalling them.

Which rank served what is read from each rank's own engine counters: `prefill_tokens_sent` grows by the prompt
length of every request the rank's engine admitted, and the prompt lengths below are chosen so each sum tells
which groups it got. With a death listener (the GeneratorSupervisor in a run), a dead rank is reported to it and the
call raises GenerationInterrupted, so the batch source runs its groups again once the rank is restarted.
"""

import functools
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import ray
import torch

from asyncppo.generation.engines import EngineSettings
from asyncppo.generation.protocol import GenerationRequest, SamplingParams
from asyncppo.models.tiny import EOS_TOKEN_ID, PAD_TOKEN_ID
from asyncppo.pipeline.errors import GenerationInterrupted
from asyncppo.workers.generator_group import GenerationWorker, GeneratorGroup, prompt_units
from asyncppo.workers.generator_worker import load_generator_worker
from asyncppo.workers.ray_cluster import init_local_ray
from asyncppo.workers.ray_host import (
    HostOptions,
    WorkerCallError,
    WorkerDiedError,
    WorkerGroup,
    wait_until_built,
)

pytestmark = pytest.mark.integration
ENGINE = EngineSettings(8, 512, 0, (EOS_TOKEN_ID,), PAD_TOKEN_ID, backend="graph")
# Enough threads per host that a call arriving while a long one decodes reaches the engine at once.
HOST = HostOptions(num_cpus=0, max_concurrency=8, torch_threads=1)


@pytest.fixture(scope="module")
def hosts(tiny_dir: Path) -> Iterator[list[object]]:
    """Three generator hosts, started together (in parallel) once for the module: ranks 0 and 1 of the group the
    routing tests share, and a spare that the dead-generator test kills."""
    # As tests/integration/conftest.py (whichever module starts the session's cluster, the other joins it): the
    # scale-out tests place 4 devices of one logical CPU each.
    init_local_ray(num_cpus=4)
    factories = [
        functools.partial(load_generator_worker, str(tiny_dir), torch.float32, "cpu", ENGINE, rank) for rank in range(3)
    ]
    starting = WorkerGroup.launch("generator", factories, HOST, timeout_s=60.0)
    wait_until_built([starting])
    started = starting.group
    yield started.hosts
    started.kill()


@pytest.fixture
def generators(hosts: list[object]) -> GeneratorGroup:
    return GeneratorGroup(WorkerGroup("generator", hosts[:2], timeout_s=60.0))


def prompt(length: int, first_token: int = 20) -> tuple[int, ...]:
    return tuple(first_token + offset % 200 for offset in range(length))


def request(prompt_ids: tuple[int, ...], max_new_tokens: int) -> GenerationRequest:
    return GenerationRequest(prompt_ids, SamplingParams(max_new_tokens=max_new_tokens, ignore_eos=True))


def prompt_tokens_sent(group: GeneratorGroup) -> list[float]:
    """Each rank's cumulative count of prompt tokens its engine admitted, in rank order."""
    return [group.group.call(rank, GenerationWorker.engine_counters)["prefill_tokens_sent"] for rank in range(2)]


def wait_until(condition: Callable[[], bool], what: str, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"gave up waiting until {what}"
        time.sleep(0.01)


def test_prompt_units_are_the_runs_of_one_prompt() -> None:
    a, b = prompt(3), prompt(3, first_token=40)
    requests = [request(p, 1) for p in (a, a, b, b, b, a)]
    assert prompt_units(requests) == [range(0, 2), range(2, 5), range(5, 6)]  # a later repeat is its own unit
    assert prompt_units([]) == []


def test_prompt_groups_spread_over_both_ranks_whole_and_results_keep_request_order(
    generators: GeneratorGroup,
) -> None:
    # Four groups of two samples; each request asks for its own number of tokens, so a result shows its request.
    lengths = [4, 10, 25, 60]
    requests = [
        request(prompt(length), max_new_tokens=2 + 2 * group + sample)
        for group, length in enumerate(lengths)
        for sample in range(2)
    ]
    before = prompt_tokens_sent(generators)
    results = generators.generate(requests)
    after = prompt_tokens_sent(generators)

    assert [len(result.token_ids) for result in results] == [2 + index for index in range(8)]
    # Every rank idle: groups alternate between the ranks (one rank's two groups, then a tie taken in turn).
    # 2*4 + 2*25 = 58 and 2*10 + 2*60 = 140; a split group would give other sums (e.g. 4 + 10 + 25 + 25 = 64).
    assert sorted(now - then for then, now in zip(before, after, strict=True)) == [58.0, 140.0]
    wait_until(lambda: generators.in_flight() == [0, 0], "both ranks answered")
    assert generators.generate([]) == []


def test_new_requests_go_to_the_idle_rank_while_the_other_decodes_a_long_group(generators: GeneratorGroup) -> None:
    long_group = [request(prompt(8), max_new_tokens=480) for _ in range(4)]
    long_call = threading.Thread(target=generators.generate, args=(long_group,))
    long_call.start()
    try:
        wait_until(lambda: sum(generators.in_flight()) == 4, "the long group is in flight")
        busy = generators.in_flight().index(4)
        idle = 1 - busy
        before = prompt_tokens_sent(generators)[idle]
        # Two calls in a row: taking the ranks in turn would send one of them to the busy rank.
        generators.generate([request(prompt(5), 3), request(prompt(5), 3)])
        assert len(generators.submit(request(prompt(7), 3)).result(timeout=30).token_ids) == 3
        assert generators.in_flight()[busy] == 4, "the long group must still run (make it longer)"
        assert prompt_tokens_sent(generators)[idle] - before == 2 * 5 + 7
    finally:
        long_call.join(timeout=60)
    wait_until(lambda: generators.in_flight() == [0, 0], "both ranks answered")


class Deaths:
    """A death listener that keeps what it is told."""

    def __init__(self) -> None:
        self.reports: list[tuple[int, object, str]] = []

    def report_death(self, rank: int, host: object, cause: str) -> None:
        self.reports.append((rank, host, cause))


def test_a_dead_generator_is_named_by_generate_and_submit_without_a_stall(hosts: list[object]) -> None:
    generators = GeneratorGroup(WorkerGroup("generator", [hosts[0], hosts[2]], timeout_s=60.0))  # the spare is rank 1
    ray.kill(generators.group.hosts[1])
    started = time.monotonic()
    # Two prompt groups: one of them goes to rank 1.
    with pytest.raises(WorkerDiedError, match=r"the generator worker \(rank 1\) died: its process ended"):
        generators.generate([request(prompt(4), 2), request(prompt(6), 2)])
    wait_until(lambda: generators.in_flight() == [0, 0], "the failed call left the in-flight counts")
    # Lone requests take idle ranks in turn, so one of two in a row goes to rank 1.
    futures = [generators.submit(request(prompt(4), 2)) for _ in range(2)]
    errors = [future.exception(timeout=30) for future in futures]
    assert any(error is None for error in errors)  # rank 0 still serves
    named = [error for error in errors if error is not None]
    assert len(named) == 1 and isinstance(named[0], WorkerCallError)
    assert "generator[1].generate: the worker process died" in str(named[0])
    assert time.monotonic() - started < 10.0
    wait_until(lambda: generators.in_flight() == [0, 0], "failed calls left the in-flight counts")

    # Supervised (as in a run): the death is reported, with the host that died, and the call is interrupted.
    deaths = Deaths()
    generators.watch_deaths(deaths)
    with pytest.raises(GenerationInterrupted, match=r"generator rank 1 died with requests of this call in flight"):
        generators.generate([request(prompt(4), 2), request(prompt(6), 2)])
    generators.reseed(5)  # calls every rank: the dead one is reported, not raised
    assert generators.seed == 5  # kept for the rank's restart
    assert [(rank, host) for rank, host, _ in deaths.reports] == [(1, hosts[2])] * 2
    assert all(cause.startswith("its process ended unexpectedly") for _, _, cause in deaths.reports)
