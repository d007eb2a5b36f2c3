"""A two-node Ray cluster on one machine (`ray.cluster_utils.Cluster`: a head and a worker node, one logical CPU
each, both on 127.0.0.1), joined by a real `asyncppo train` through cluster.ray_address.

The config puts the generator on a whole node of its own (generation.colocated.resources.num_nodes: 1), so the
trainers take the other one: the run's placement.json must show exactly that, with weight sync crossing nodes. Beside
that cluster, a program without an address starts a loopback cluster of its own, even when it imported Ray first.
"""

import json
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from asyncppo.workers.ray_cluster import LOCAL_ONLY_ENV

pytestmark = [pytest.mark.integration, pytest.mark.slow]
HERE = Path(__file__).parent


@pytest.fixture(scope="module")
def two_nodes() -> Iterator[Any]:
    """One cluster for the module's tests (starting one costs several seconds); neither test changes it."""
    from ray.cluster_utils import Cluster

    from asyncppo.workers.ray_cluster import keep_ray_on_loopback

    keep_ray_on_loopback()  # both nodes on 127.0.0.1: Ray would put them on the machine's network IP
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "node_ip_address": "127.0.0.1"})
    try:
        cluster.add_node(num_cpus=1, node_ip_address="127.0.0.1")
        cluster.wait_for_nodes()
        yield cluster
    finally:
        cluster.shutdown()


def _train(config: Path, cache_dir: Path, *overrides: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "ASYNCPPO_CACHE_DIR": str(cache_dir), "PYTHONPATH": str(HERE)}  # the partial_credit reward
    env.pop("RAY_ADDRESS", None)
    env.pop(LOCAL_ONLY_ENV, None)  # the driver joins as on a real cluster: Ray's local-only switch left off
    return subprocess.run(
        [sys.executable, "-m", "asyncppo", "train", str(config), *overrides],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )


def test_trainers_and_generator_on_separate_nodes_train_three_async_steps(
    two_nodes: Any, cache_dir: Path, data_dir: Path, tmp_path: Path, tiny_run_tree: Callable[..., dict[str, Any]]
):
    tree = tiny_run_tree(data_dir, max_num_steps=3, val_at_end=False, async_ppo={"enabled": True})
    tree["loss_fn"] = {"use_importance_sampling_correction": True}
    tree["generation"]["colocated"] = {"enabled": False, "resources": {"num_nodes": 1, "gpus_per_node": 1}}
    tree["cluster"].update(num_nodes=2, gpus_per_node=1, ray_address=two_nodes.address)
    tree["logger"].update(log_dir=str(tmp_path / "run"), tensorboard_enabled=False)
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump(tree))

    result = _train(config, cache_dir)
    assert result.returncode == 0, result.stderr[-3000:]
    metrics = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [record["step"] for record in metrics] == [1, 2, 3]
    placement = json.loads((tmp_path / "run" / "placement.json").read_text())
    nodes = {(record["role"], record["rank"]): record["node_id"] for record in placement}
    assert sorted(nodes) == [("generator", 0), ("policy", 0), ("value", 0)]
    cluster_nodes = {two_nodes.head_node.node_id} | {node.node_id for node in two_nodes.worker_nodes}
    assert nodes[("policy", 0)] == nodes[("value", 0)] != nodes[("generator", 0)]
    assert set(nodes.values()) == cluster_nodes
    assert "placement: policy x1 on 127.0.0.1; value x1 on 127.0.0.1; generator x1 on 127.0.0.1" in result.stdout


# A program that imports Ray before asyncppo (as a user's script or a test module may): Ray has then read its
# local-only switch already, and without asyncppo setting it again the cluster would come up on the machine's network
# IP, listening on every interface.
RAY_FIRST = """
import ray
from asyncppo.workers.ray_cluster import init_local_ray
init_local_ray(num_cpus=3)
print(ray.cluster_resources()["CPU"], ray.get_runtime_context().gcs_address)
print(ray.util.get_node_ip_address())
print(ray.get(ray.remote(lambda: ray.util.get_node_ip_address()).remote()))
ray.shutdown()
"""


def test_a_run_without_an_address_starts_its_own_loopback_cluster_beside_a_running_one_even_if_ray_came_first(
    two_nodes: Any,
):
    # `ray start` (here: the two-node cluster) registers itself for `ray.init()` to join; a run without
    # cluster.ray_address must start its own local cluster of the size it asks for instead. The local-only switch
    # is left out of the environment (this process set it when it started the two nodes), so the program's own
    # import of Ray reads it unset.
    env = {key: value for key, value in os.environ.items() if key not in ("RAY_ADDRESS", LOCAL_ONLY_ENV)}
    result = subprocess.run([sys.executable, "-c", RAY_FIRST], capture_output=True, text=True, env=env, timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    cpus, address, driver_ip, worker_ip = result.stdout.split()[-4:]
    assert float(cpus) == 3.0 and address != two_nodes.address
    assert (driver_ip, worker_ip) == ("127.0.0.1", "127.0.0.1")  # the driver, and a worker the cluster started
