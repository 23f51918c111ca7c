"""This machine's processes as the test's own stack sees them: those in the test's PID namespace.

The launch test (tests/cluster_launch) runs Ray and a vLLM replica of the same model on hosts made of
namespaces with PIDs of their own; their processes still show in the machine's process list, under the
same titles (`ray::ServeReplica:spillover:SpilloverLLMServer:<model>`), and a suite running beside it must
not take them for its own."""

from __future__ import annotations

import os
from collections.abc import Iterator

import psutil

OWN = os.readlink("/proc/self/ns/pid")


def own_processes() -> Iterator[psutil.Process]:
    """`psutil.process_iter(["cmdline"])` less the processes of other PID namespaces."""
    for proc in psutil.process_iter(["cmdline"]):
        try:
            if os.readlink(f"/proc/{proc.pid}/ns/pid") == OWN:
                yield proc
        except OSError:  # gone, or not ours to read
            continue
