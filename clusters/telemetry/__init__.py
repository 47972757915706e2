"""Telemetry: what Volt learns of a running cluster, and what it does about it.

`watch` (the sweep: node health and bandwidth samples every VOLT_WATCH_INTERVAL_S, degrading a cluster
that lost a node), `health` (the verdict rules, pure), `metrics` (samples and their per-minute rollups),
`bandwidth_watch` (the periodic and on-demand all-reduce probe of an idle READY cluster), `ray_head`
(what the head says of its nodes, with the cluster's token), `measurements` (bandwidth figures by domain:
Volt's probes and a provider's nccl-tests uploads).
"""
