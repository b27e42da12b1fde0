"""Pytest plugin: one local Ray cluster of two nodes for the whole session, shared by every Ray test.

``ray_cluster`` starts a head node and one worker node (``ray.cluster_utils.Cluster``: real raylets, one CPU
each, the smallest object stores Ray allows) and joins this process to it, so every ``engine="ray"`` step of
the planner runs its tasks on both nodes (``zephon.planner.ray_cluster.ray_session`` joins a running Ray). It
is started on first use (21–34 s measured on the shared 2-core machine, load 8–18) and shut down at the end of the
session; tests that never ask for it never pay for it.

The nodes' processes get their own variables (``env_vars``; this process's environment is left alone): a session
cache directory, the Hub offline, and ``ZEPHON_RAY_FAILPOINT`` naming a file a test creates to kill the next task's worker
(``failpoint``). Per-test variables (a bucket's endpoint) reach the tasks through the driver, as on a real
cluster.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

#: The smallest object store Ray accepts (bytes); the tests move kilobytes.
OBJECT_STORE = 80 * 2**20


@dataclass(frozen=True)
class RayCluster:
    """The running two-node cluster: its address and the file that, when it exists, kills the next task."""

    address: str
    failpoint: Path
    nodes: int


@pytest.fixture(scope="session")
def ray_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RayCluster]:
    ray = pytest.importorskip("ray")
    from ray.cluster_utils import Cluster

    root = tmp_path_factory.mktemp("ray-cluster")
    failpoint = root / "kill-next-task"
    env = {"ZEPHON_CACHE_DIR": str(root / "cache"), "HF_HUB_OFFLINE": "1", "ZEPHON_RAY_FAILPOINT": str(failpoint)}
    node = {"num_cpus": 1, "object_store_memory": OBJECT_STORE, "env_vars": env}
    cluster = Cluster(initialize_head=True, head_node_args={**node, "include_dashboard": False})
    try:
        cluster.add_node(**node)
        cluster.wait_for_nodes()
        ray.init(address=cluster.address, log_to_driver=False, logging_level="ERROR")
        yield RayCluster(address=cluster.address, failpoint=failpoint, nodes=len(ray.nodes()))
    finally:
        ray.shutdown()
        cluster.shutdown()
