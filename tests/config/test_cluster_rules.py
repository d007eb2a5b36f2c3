"""The load-time rules of the cluster and placement keys: several nodes, the generators' resources (NeMo-RL's
`generation.colocated.resources`) and how they set `generation.num_workers`, and the critic's own devices."""

import pytest
from rejections import rejected

from asyncppo.config import validate_tree


def test_a_multi_node_cluster_is_accepted(tree):
    tree["cluster"] = {"num_nodes": 2, "gpus_per_node": 8, "ray_address": "10.0.0.1:6379"}
    cluster = validate_tree(tree).cluster
    assert (cluster.num_nodes, cluster.gpus_per_node, cluster.ray_address) == (2, 8, "10.0.0.1:6379")
    tree["cluster"]["num_nodes"] = 0
    assert rejected(tree).startswith("cluster.num_nodes: Input should be greater than 0")


def _separate_generators(tree, resources, num_workers=None):
    generation = {"colocated": {"enabled": False, "resources": resources}}
    if num_workers is not None:
        generation["num_workers"] = num_workers
    tree["generation"] = generation
    return tree


@pytest.mark.parametrize(
    ("resources", "num_workers"),
    [({"gpus_per_node": 4}, 4), ({"gpus_per_node": 8, "num_nodes": 1}, 8), ({"gpus_per_node": 8, "num_nodes": 3}, 24)],
)
def test_generator_resources_set_the_number_of_generators(tree, resources, num_workers):
    # generation.num_workers = resources.gpus_per_node x (resources.num_nodes or 1)
    _separate_generators(tree, resources)
    tree["cluster"] = {"num_nodes": 4}
    config = validate_tree(tree)
    assert config.generation.num_workers == num_workers
    # An explicit num_workers that agrees is accepted, and the resolved config validates again as it is saved.
    assert validate_tree(_separate_generators(tree, resources, num_workers)) == config
    assert validate_tree(config.model_dump(mode="json")) == config


def test_without_generator_resources_num_workers_stands(tree):
    tree["generation"] = {"colocated": {"enabled": False}, "num_workers": 3}
    config = validate_tree(tree)
    assert config.generation.num_workers == 3 and not config.generation.colocated.resources.provided_any


def test_an_explicit_num_workers_must_agree_with_the_generator_resources(tree):
    _separate_generators(tree, {"gpus_per_node": 4, "num_nodes": 2}, num_workers=3)
    tree["cluster"] = {"num_nodes": 3}
    assert rejected(tree) == (
        "generation.num_workers: 3 disagrees with colocated.resources: gpus_per_node=4 x num_nodes=2 = 8 generators; "
        "set one of them"
    )


def test_generator_resources_need_non_colocated_generation(tree):
    tree["generation"] = {"colocated": {"resources": {"gpus_per_node": 2}}}
    assert rejected(tree) == (
        "generation.colocated.resources: sets generator devices, but generation runs inside the policy workers "
        "(enabled: true); set generation.colocated.enabled: false or remove generation.colocated.resources"
    )


def test_generator_nodes_need_generator_devices_per_node(tree):
    _separate_generators(tree, {"num_nodes": 1})
    tree["cluster"] = {"num_nodes": 2}
    assert rejected(tree) == (
        "generation.colocated.resources.gpus_per_node: must be set with colocated.resources.num_nodes=1 (generator "
        "devices per node)"
    )


def test_generator_nodes_must_leave_the_trainers_a_node(tree):
    _separate_generators(tree, {"gpus_per_node": 8, "num_nodes": 2})
    tree["cluster"] = {"num_nodes": 2, "gpus_per_node": 8}
    assert rejected(tree) == (
        "generation.colocated.resources.num_nodes: 2 whole nodes for generators leave none of cluster.num_nodes=2 for "
        "the trainers; raise cluster.num_nodes or lower this"
    )
    tree["cluster"]["num_nodes"] = 3
    assert validate_tree(tree).generation.num_workers == 16


def test_generator_nodes_are_as_large_as_the_clusters_nodes(tree):
    _separate_generators(tree, {"gpus_per_node": 4, "num_nodes": 1})
    tree["cluster"] = {"num_nodes": 2, "gpus_per_node": 8}
    assert rejected(tree) == (
        "generation.colocated.resources.gpus_per_node: 4 must equal cluster.gpus_per_node=8: generators take whole "
        "nodes"
    )
    # cluster.gpus_per_node 0 (not stated): nothing to compare with.
    tree["cluster"]["gpus_per_node"] = 0
    assert validate_tree(tree).generation.num_workers == 4
    # Generators beside the trainers (no resources.num_nodes) may take part of a node.
    tree["cluster"]["gpus_per_node"] = 8
    tree["generation"]["colocated"]["resources"] = {"gpus_per_node": 4}
    assert validate_tree(tree).generation.num_workers == 4


def test_the_critic_shares_the_policys_devices_unless_told(tree):
    value = validate_tree(tree).value
    assert value is not None and not value.own_devices
    tree["value"]["own_devices"] = True
    value = validate_tree(tree).value
    assert value is not None and value.own_devices
