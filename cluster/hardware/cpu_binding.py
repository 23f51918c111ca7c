"""Which cores a vLLM-CPU engine's OpenMP threads are bound to. Pure.

vLLM-CPU binds its worker's threads itself (`VLLM_CPU_OMP_THREADS_BIND=auto`): to the cores of the
process's first NUMA node, minus one core it keeps for its own scheduler process. Every engine on a
node does that independently, so two Serve-hosted engines on a 2-core machine were both bound to core
0 (and ran one OpenMP thread each, `OMP_NUM_THREADS=1`), while core 1 idled. Here each engine asks for
`threads` cores (from its `models[].num_cpus`) and gets the least-used ones among the cores the
process may run on, one logical CPU per physical core:

* cores no other engine on the node holds come first; among equally used ones, any but the last
  physical core (kept, while others are free, for the engines' scheduler processes, the gateway and
  Ray, as vLLM's own auto-binding keeps one), then the lowest id;
* an engine never gets more cores than there are, and always at least one.

The claims of the engines already running come from serve_apps/engine/cpus.py (a file per engine on
the node); the result is given to vLLM as `VLLM_CPU_OMP_THREADS_BIND`, which also sets its thread count.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence


def physical_cores(allowed: Iterable[int], core_of: Mapping[int, tuple[int, int]]) -> list[int]:
    """One logical CPU (the lowest id) per physical core among `allowed`; `core_of`: cpu → (package,
    core id), missing entries count as cores of their own."""
    seen: dict[tuple[int, int], int] = {}
    for cpu in sorted(set(allowed)):
        key = core_of.get(cpu, (-1, -1 - cpu))
        seen.setdefault(key, cpu)
    return sorted(seen.values())


def choose_cores(cores: Sequence[int], threads: int, claimed: Mapping[int, int]) -> list[int]:
    """`threads` of `cores` for a new engine; `claimed`: core → engines on the node already bound to it."""
    if not cores:
        return []
    want = max(1, min(threads, len(cores)))
    last = max(cores)
    spare = len(cores) > want

    def rank(core: int) -> tuple[int, int, int]:
        return (claimed.get(core, 0), int(spare and core == last), core)

    return sorted(sorted(cores, key=rank)[:want])


def bind_spec(cores: Sequence[int]) -> str:
    """vLLM's `VLLM_CPU_OMP_THREADS_BIND` syntax: ids and ranges, e.g. '0-3,8'."""
    parts: list[str] = []
    ordered = sorted(set(cores))
    start = prev = None
    for core in ordered:
        if start is None:
            start = prev = core
        elif prev is not None and core == prev + 1:
            prev = core
        else:
            parts.append(f"{start}" if start == prev else f"{start}-{prev}")
            start = prev = core
    if start is not None:
        parts.append(f"{start}" if start == prev else f"{start}-{prev}")
    return ",".join(parts)
