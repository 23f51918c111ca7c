"""The local models: their `LLMConfig`, the model replica and what it checks of its engine, which replica
takes a request, and how the gateway reaches the replicas.

    llm.py              one ray.serve.llm `LLMConfig` per configured model
    llm_server.py       SpilloverLLMServer: LLMServer plus the stats path and the engine checks
    startup.py          what a replica decides about its engine before starting it, and checks right after
    numerics_probe.py   the replica's numerics check of its own engine
    cpus.py             the cores each vLLM-CPU engine on a node holds
    gpus.py             the processes and GPUs of a replica's engine, its GPUs' memory by owner
    watchdog.py         a wedged engine turned into a dead one
    reaper.py           engine processes do not outlive their replica
    gpu_sim_workers.py  stand-ins for vLLM's GPU workers in a `gpu-sim` replica
    replica_router.py   which replica takes a request: prefix affinity, minus saturated replicas
    local_backend.py    ServeHandleBackend: the gateway's `ModelBackend` over Ray Serve handles
    replies.py          the engine's replies and errors as spillover values
    first_chunk.py      a streamed answer's first chunk at once, the rest batched
    ray_ingress.py      Ray's own OpenAI ingress over the replicas, the baseline of `bench overhead`
"""

# The modules of this wing the rest of serve_apps/ may import: its doors (tests/unit/test_wing_doors.py).
DOORS: tuple[str, ...] = ("llm", "llm_server", "local_backend")
