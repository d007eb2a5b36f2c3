"""A CUDA run that asks for more GPUs than the cluster has is one config error with the arithmetic, before Ray."""

from pathlib import Path

import pytest

from asyncppo.config import ConfigError, load_config
from asyncppo.trainer.placement import check_device_fit, device_demand

DEMO = Path(__file__).parents[2] / "examples" / "configs" / "demo.yaml"  # non-colocated, one generator


def test_two_generators_and_the_trainers_do_not_fit_two_stated_gpus():
    config = load_config(DEMO, ["generation.num_workers=2", "cluster.gpus_per_node=2"])
    assert device_demand(config).total == 3
    with pytest.raises(ConfigError) as raised:
        check_device_fit(config, "cuda", visible_gpus=8)
    assert raised.value.lines == [
        "cluster: the run needs 3 GPUs (1 for the policy and value trainers, which share it; generation.num_workers=2 "
        "non-colocated generators, 1 each) but cluster.gpus_per_node=2 x cluster.num_nodes=1 = 2; lower "
        "generation.num_workers, set generation.colocated.enabled: true, or give the cluster more GPUs"
    ]


def test_a_local_cluster_is_bounded_by_the_gpus_the_machine_shows():
    config = load_config(DEMO, [])
    check_device_fit(config, "cuda", visible_gpus=2)  # trainers + one generator: fits exactly
    with pytest.raises(ConfigError) as raised:
        check_device_fit(config, "cuda", visible_gpus=1)
    assert "needs 2 GPUs" in raised.value.lines[0] and "this machine shows 1" in raised.value.lines[0]


def test_colocated_generation_needs_only_the_trainers_device():
    config = load_config(DEMO, ["generation.colocated.enabled=true", "ppo.async_ppo.enabled=false"])
    assert device_demand(config).total == 1
    check_device_fit(config, "cuda", visible_gpus=1)


def test_cpu_runs_and_unsized_existing_clusters_are_not_checked():
    config = load_config(DEMO, ["generation.num_workers=4"])
    check_device_fit(config, "cpu", visible_gpus=0)
    on_a_cluster = load_config(DEMO, ["generation.num_workers=4", "cluster.ray_address=127.0.0.1:6379"])
    check_device_fit(on_a_cluster, "cuda", visible_gpus=0)
