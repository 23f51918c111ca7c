"""Moved to router/snapshot.py (the router's input types live in the router layer).

This name is kept only while in-flight branches still import it; new code imports router.snapshot.
"""

from router.snapshot import ClusterSnapshot, GpuMemory, GpuProcessMemory, ReplicaStats

__all__ = ["ClusterSnapshot", "GpuMemory", "GpuProcessMemory", "ReplicaStats"]
