"""Provisioning building blocks: start, find and stop the Ray nodes of a cluster through host drivers.

Pure Python (no Django import): functions take `HostDriver`s and plain values.
"""

from .ray_nodes import (
    MAX_SLOT,
    PORT_BASE,
    PORTS_PER_SLOT,
    JobTimedOut,
    NodeHandle,
    NodePorts,
    NodesNotReady,
    NodeStartFailed,
    find_node,
    host_resource_name,
    node_processes,
    ports_for,
    read_node_log,
    start_head,
    start_worker,
    stop_node,
    submit_job,
    wait_for_nodes,
    workdir_for,
)

__all__ = [
    "MAX_SLOT",
    "PORT_BASE",
    "PORTS_PER_SLOT",
    "JobTimedOut",
    "NodeHandle",
    "NodePorts",
    "NodeStartFailed",
    "NodesNotReady",
    "find_node",
    "host_resource_name",
    "node_processes",
    "ports_for",
    "read_node_log",
    "start_head",
    "start_worker",
    "stop_node",
    "submit_job",
    "wait_for_nodes",
    "workdir_for",
]
