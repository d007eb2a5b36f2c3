"""The run's own Ray cluster stays on loopback however the program imported Ray."""

import subprocess
import sys

import pytest

pytestmark = [pytest.mark.integration]

# A program that imports Ray before asyncppo (as a user's script or a test module may): Ray has then read its
# local-only switch already, and without asyncppo setting it again the cluster would come up on the machine's
# network IP, listening on every interface.
RAY_FIRST = """
import ray
from asyncppo.workers.ray_host import init_local_ray
init_local_ray(num_cpus=1)
print(ray.util.get_node_ip_address())
print(ray.get(ray.remote(lambda: ray.util.get_node_ip_address()).remote()))
ray.shutdown()
"""


def test_a_program_that_imported_ray_first_still_starts_its_cluster_on_loopback():
    result = subprocess.run([sys.executable, "-c", RAY_FIRST], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.split() == ["127.0.0.1", "127.0.0.1"]  # the driver, and a worker the cluster started
