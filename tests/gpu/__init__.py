"""Checks that need a real NVIDIA GPU (`scripts/test tests/gpu`); each module skips, saying why, elsewhere."""

from __future__ import annotations

from types import ModuleType

import pytest

from cluster.hardware.nvml import PynvmlReader


def cuda_torch_or_skip() -> ModuleType:
    """torch with CUDA on a machine where NVML finds a GPU; otherwise the calling module is skipped."""
    with PynvmlReader() as reader:
        inventory = reader.read()
    if inventory.state != "ok":
        pytest.skip(f"no GPU found by NVML ({inventory.state}: {inventory.reason})", allow_module_level=True)
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch has no CUDA here (CPU build?)", allow_module_level=True)
    return torch
