"""Provisioning building blocks: start, find and stop the Ray nodes of a cluster through host drivers.

Pure Python (no Django import): functions take `HostDriver`s and plain values.
"""

from .ray_nodes import (
    JOB_MARKER_VAR,
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
    job_processes,
    node_processes,
    ports_for,
    probe_port,
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
    "JOB_MARKER_VAR",
    "find_node",
    "job_processes",
    "host_resource_name",
    "node_processes",
    "ports_for",
    "probe_port",
    "read_node_log",
    "start_head",
    "start_worker",
    "stop_node",
    "submit_job",
    "wait_for_nodes",
    "workdir_for",
]
