"""The ranks a run starts from the cluster keys, and the one-line config errors (with the arithmetic) when the
cluster cannot hold them, all before Ray starts."""

from pathlib import Path

import pytest

from asyncppo.config import ConfigError, load_config
from asyncppo.trainer.build import build_run
from asyncppo.trainer.placement import Layout, check_device_fit, plan_layout

DEMO = Path(__file__).parents[2] / "examples" / "configs" / "demo.yaml"  # non-colocated, one generator, a critic


def _error_line(overrides: list[str], device: str = "cuda", visible_gpus: int = 8) -> str:
    with pytest.raises(ConfigError) as raised:
        check_device_fit(load_config(DEMO, overrides), device, visible_gpus)
    assert len(raised.value.lines) == 1
    return raised.value.lines[0]


def test_an_unstated_cluster_runs_one_trainer_rank_beside_its_generators():
    layout = plan_layout(load_config(DEMO, ["generation.num_workers=3"]))
    assert layout == Layout(policy_ranks=1, critic_ranks=1, critic_own_devices=False, generators=3)
    assert layout.trainer_devices == 1 and layout.total == 4


def test_the_trainers_take_every_stated_device_the_generators_do_not():
    config = load_config(DEMO, ["cluster.gpus_per_node=4", "cluster.num_nodes=2", "generation.num_workers=2"])
    assert plan_layout(config) == Layout(policy_ranks=6, critic_ranks=6, critic_own_devices=False, generators=2)
    own = load_config(DEMO, ["cluster.gpus_per_node=6", "generation.num_workers=2", "value.own_devices=true"])
    assert plan_layout(own) == Layout(policy_ranks=2, critic_ranks=2, critic_own_devices=True, generators=2)
    assert plan_layout(own).trainer_devices == 4


def test_generators_on_whole_nodes_leave_the_other_nodes_to_the_trainers():
    overrides = [
        "cluster.gpus_per_node=8",
        "cluster.num_nodes=2",
        "generation.colocated.resources.num_nodes=1",
        "generation.colocated.resources.gpus_per_node=8",
    ]
    layout = plan_layout(load_config(DEMO, overrides))
    assert (layout.policy_ranks, layout.generators) == (8, 8)


def test_no_device_left_for_the_trainers_names_the_arithmetic():
    assert _error_line(["cluster.gpus_per_node=2", "generation.num_workers=2"]) == (
        "cluster: cluster.gpus_per_node=2 x cluster.num_nodes=1 = 2 devices leave none for the trainers after "
        "generation.num_workers=2 generators; lower generation.num_workers or give the cluster more devices"
    )


def test_an_odd_number_of_trainer_devices_cannot_split_between_policy_and_critic():
    line = _error_line(["cluster.gpus_per_node=4", "generation.num_workers=1", "value.own_devices=true"])
    assert line.startswith("value.own_devices: the 3 trainer devices (cluster.gpus_per_node=4 x cluster.num_nodes=1")


def test_colocated_generation_is_refused_with_more_than_one_trainer_rank():
    line = _error_line(["cluster.gpus_per_node=2", "generation.colocated.enabled=true", "ppo.async_ppo.enabled=false"])
    assert line.startswith("generation.colocated.enabled: colocated generation runs with one trainer rank")
    assert "gives the policy 2 ranks" in line


def test_several_nodes_need_an_existing_ray_cluster(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    overrides = ["cluster.num_nodes=2", "cluster.gpus_per_node=1"]
    assert _error_line(overrides).startswith("cluster.num_nodes: 2 nodes need an existing Ray cluster")
    monkeypatch.setenv("RAY_ADDRESS", "127.0.0.1:6379")  # Ray's own variable: the reservation checks the size
    assert check_device_fit(load_config(DEMO, overrides), "cuda", visible_gpus=0).policy_ranks == 1


def test_a_local_cuda_cluster_is_bounded_by_the_gpus_the_machine_shows():
    check_device_fit(load_config(DEMO, []), "cuda", visible_gpus=2)  # trainers + one generator: fits exactly
    assert _error_line([], visible_gpus=1) == (
        "cluster: the run needs 2 GPUs (1 policy rank(s) (the critic's ranks share their devices) + 1 generator(s)) "
        "but this machine shows 1 GPUs; lower generation.num_workers, set generation.colocated.enabled: true, or "
        "give the cluster more devices"
    )
    assert _error_line(["cluster.gpus_per_node=4"], visible_gpus=2) == (
        "cluster.gpus_per_node: 4 GPUs but this machine shows 2 GPUs; lower cluster.gpus_per_node"
    )


def test_a_cpu_run_is_bounded_by_cluster_num_cpus_when_set():
    check_device_fit(load_config(DEMO, ["cluster.gpus_per_node=4", "generation.num_workers=2"]), "cpu", 0)
    line = _error_line(["generation.num_workers=3", "cluster.num_cpus=2"], device="cpu")
    assert line.startswith("cluster: the run needs 4 devices (one logical CPU each) (1 policy rank(s)")
    assert "but cluster.num_cpus=2" in line


def test_colocated_generation_needs_only_the_trainers_device():
    config = load_config(DEMO, ["generation.colocated.enabled=true", "ppo.async_ppo.enabled=false"])
    assert check_device_fit(config, "cuda", visible_gpus=1).total == 1


def test_the_build_refuses_a_misfit_before_ray_starts_or_anything_is_written(
    ray_tripwire: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    config = load_config(DEMO, ["cluster.num_nodes=2", "cluster.gpus_per_node=2", "cluster.device=cpu"])
    with pytest.raises(ConfigError, match=r"^cluster.num_nodes: 2 nodes need an existing Ray cluster"):
        build_run(config, tmp_path / "run")
    assert not (tmp_path / "run").exists()
