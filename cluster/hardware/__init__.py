"""What a node's hardware is and how full it is: its CPU, its cores, its GPUs through NVML (real,
fake, simulated) and whose their memory is.

    cpu_caps.py     what the CPU can do (AMX, AVX-512, bf16), read from /proc/cpuinfo
    cpu_binding.py  which cores a vLLM-CPU engine's OpenMP threads are bound to
    nvml.py         the GPU reader: GPUs and their memory, read through NVML
    nvml_fake.py    a fake pynvml module for tests
    nvml_sim.py     simulated GPUs from a JSON file (`SPILLOVER_FAKE_NVML`)
    gpu_memory.py   a replica's GPU memory split into its engine's and everyone else's
"""

# The modules of this wing the rest of cluster/ may import: its doors (tests/unit/test_wing_doors.py).
DOORS: tuple[str, ...] = ("cpu_caps",)
