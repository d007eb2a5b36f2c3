"""How many devices a run asks for, checked against what the cluster has before Ray starts.

Ray never fails an actor that asks for more GPUs than exist: it waits for them, so a run that does not fit
would stall at start-up with nothing printed. This module turns that into one config error with the arithmetic:

    needed = 1 (the policy and value trainers share one device: 0.5 GPU each)
           + generation.num_workers   (non-colocated generators, one device each; 0 when colocated)
    has    = cluster.gpus_per_node x cluster.num_nodes, when set; else the GPUs this machine shows (local cluster)
"""

from dataclasses import dataclass

from asyncppo.config import ConfigError, RunConfig


@dataclass(frozen=True)
class DeviceDemand:
    """GPUs a run asks for, by role."""

    trainers: int
    generators: int

    @property
    def total(self) -> int:
        return self.trainers + self.generators


def device_demand(config: RunConfig) -> DeviceDemand:
    """What a CUDA run asks of Ray: see the module docstring."""
    generators = 0 if config.generation.colocated.enabled else config.generation.num_workers
    return DeviceDemand(trainers=1, generators=generators)


def check_device_fit(config: RunConfig, device: str, visible_gpus: int) -> None:
    """ConfigError when a CUDA run asks for more GPUs than the cluster has; nothing to check on CPU.

    visible_gpus: the GPUs this machine shows; it bounds a local cluster when cluster.gpus_per_node is 0.
    """
    if device != "cuda":
        return
    demand = device_demand(config)
    cluster = config.cluster
    if cluster.gpus_per_node > 0:
        has = cluster.gpus_per_node * cluster.num_nodes
        source = f"cluster.gpus_per_node={cluster.gpus_per_node} x cluster.num_nodes={cluster.num_nodes} = {has}"
    elif cluster.ray_address is None:
        has = visible_gpus
        source = f"this machine shows {has} (cluster.gpus_per_node: 0)"
    else:
        return  # an existing cluster without a stated size: Ray knows it, we do not
    if demand.total <= has:
        return
    generators = (
        "generation colocated (0 for generators)"
        if config.generation.colocated.enabled
        else f"generation.num_workers={config.generation.num_workers} non-colocated generators, 1 each"
    )
    raise ConfigError(
        [
            f"cluster: the run needs {demand.total} GPUs (1 for the policy and value trainers, which share it; "
            f"{generators}) but {source}; lower generation.num_workers, set generation.colocated.enabled: true, "
            "or give the cluster more GPUs"
        ]
    )
