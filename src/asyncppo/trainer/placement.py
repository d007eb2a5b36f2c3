"""How many ranks of each role a run starts and the devices they take, checked before Ray starts.

A device is one GPU on CUDA runs and one logical Ray CPU on CPU runs. Ray never fails an actor that asks for more
than exists: it waits, so a run that does not fit would stall at start-up with nothing printed. This module turns
that into one config error with the arithmetic:

    generators     = generation.num_workers (non-colocated; 0 when colocated)
    trainer devices = 1 when cluster.gpus_per_node is 0 (not stated),
                      else cluster.gpus_per_node x cluster.num_nodes - generators (NeMo-RL's rule)
    policy ranks   = trainer devices (critic rank i shares device i, half each),
                      or half of them with value.own_devices (the critic's ranks take the other half)
    has            = the stated size; else the GPUs this machine shows (a local CUDA cluster), or cluster.num_cpus
"""

import os
from dataclasses import dataclass

from asyncppo.config import ConfigError, RunConfig


@dataclass(frozen=True)
class Layout:
    """The ranks a run starts and the devices they take."""

    policy_ranks: int
    """Data-parallel ranks of the policy (FSDP2 over them when more than one)."""
    critic_ranks: int
    """Data-parallel ranks of the critic (as many as the policy's; 0 without a critic)."""
    critic_own_devices: bool
    """The critic's ranks on devices of their own (value.own_devices), else sharing the policy's."""
    generators: int
    """Non-colocated generator workers, one device each (0 when colocated)."""

    @property
    def trainer_devices(self) -> int:
        return self.policy_ranks + (self.critic_ranks if self.critic_own_devices else 0)

    @property
    def total(self) -> int:
        return self.trainer_devices + self.generators


def ray_address(config: RunConfig) -> str | None:
    """The existing Ray cluster to join: cluster.ray_address, else RAY_ADDRESS; None starts a local cluster."""
    return config.cluster.ray_address or os.environ.get("RAY_ADDRESS") or None


def plan_layout(config: RunConfig) -> Layout:
    """The run's ranks from the cluster keys; ConfigError naming the numbers when they leave no trainer device."""
    cluster = config.cluster
    colocated = config.generation.colocated.enabled
    generators = 0 if colocated else config.generation.num_workers
    own_devices = config.value is not None and config.value.own_devices
    ranks = 1
    if cluster.gpus_per_node > 0:
        stated = cluster.gpus_per_node * cluster.num_nodes
        sizes = f"cluster.gpus_per_node={cluster.gpus_per_node} x cluster.num_nodes={cluster.num_nodes} = {stated}"
        trainer_devices = stated - generators
        if trainer_devices < 1:
            raise ConfigError(
                [
                    f"cluster: {sizes} devices leave none for the trainers after generation.num_workers={generators} "
                    "generators; lower generation.num_workers or give the cluster more devices"
                ]
            )
        ranks = trainer_devices
        if own_devices:
            if trainer_devices % 2:
                raise ConfigError(
                    [
                        f"value.own_devices: the {trainer_devices} trainer devices ({sizes}, less {generators} "
                        "generators) do not split evenly between policy and critic ranks; give the trainers an even "
                        "number of devices or set value.own_devices: false"
                    ]
                )
            ranks = trainer_devices // 2
        if colocated and ranks > 1:
            raise ConfigError(
                [
                    f"generation.colocated.enabled: colocated generation runs with one trainer rank, but {sizes} gives "
                    f"the policy {ranks} ranks; set generation.colocated.enabled: false, or cluster.gpus_per_node: 0"
                ]
            )
    return Layout(
        policy_ranks=ranks,
        critic_ranks=ranks if config.value is not None else 0,
        critic_own_devices=own_devices,
        generators=generators,
    )


def _roles(layout: Layout) -> str:
    trainers = f"{layout.policy_ranks} policy rank(s)"
    if layout.critic_ranks:
        trainers += (
            f" + {layout.critic_ranks} critic rank(s) on their own devices"
            if layout.critic_own_devices
            else " (the critic's ranks share their devices)"
        )
    return f"{trainers} + {layout.generators} generator(s)"


def check_device_fit(config: RunConfig, device: str, visible_gpus: int) -> Layout:
    """The run's layout; ConfigError when it asks for more devices than the cluster has, or more nodes than a
    local cluster has.

    visible_gpus: the GPUs this machine shows; it bounds a local CUDA cluster.
    """
    layout = plan_layout(config)
    cluster = config.cluster
    address = ray_address(config)
    if address is None and cluster.num_nodes > 1:
        raise ConfigError(
            [
                f"cluster.num_nodes: {cluster.num_nodes} nodes need an existing Ray cluster; start one "
                "(docs/multi-node.md) and set cluster.ray_address or RAY_ADDRESS"
            ]
        )
    if address is not None:
        return layout  # Ray knows the cluster's size; placement checks the reservation against it
    if device == "cuda":
        has, source = visible_gpus, f"this machine shows {visible_gpus} GPUs"
    elif cluster.num_cpus is not None:
        has, source = cluster.num_cpus, f"cluster.num_cpus={cluster.num_cpus}"
    else:
        return layout  # a local CPU cluster is started with a logical CPU per device
    unit = "GPUs" if device == "cuda" else "devices (one logical CPU each)"
    if cluster.gpus_per_node > has:
        raise ConfigError(
            [f"cluster.gpus_per_node: {cluster.gpus_per_node} {unit} but {source}; lower cluster.gpus_per_node"]
        )
    if layout.total > has:
        raise ConfigError(
            [
                f"cluster: the run needs {layout.total} {unit} ({_roles(layout)}) but {source}; lower "
                "generation.num_workers, set generation.colocated.enabled: true, or give the cluster more devices"
            ]
        )
    return layout
