"""Clusters: requests, placements, allocations and their lifecycle (placement engine in placement/)."""
