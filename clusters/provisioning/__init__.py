"""Provisioning: from allocated GPUs to a verified Ray cluster, and back (clusters/provision.py is the
task body and the face of this folder for other modules).

Building blocks, pure Python (no Django import; functions take `HostDriver`s and plain values):
`ray_nodes` (start, find and stop a cluster's Ray nodes), `ray_http` (the one client of a head's HTTP
API), `node_users` and `node_firewall` (a cluster's Unix user and its closed ports on a host).
Operations on a cluster's rows, one floor each (pyproject's layers contract): `nodes` (bring them up),
`ending` (teardown, fail), `replacement` (failed or slow hosts), `verification` (the probe, READY).
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
