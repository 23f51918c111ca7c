"""What a node learnt about bf16 on its CPU: a failed numerics check, kept for the next start.

One small JSON file per (model source, CPU signature, vLLM version) under the project's cache on the
node the replica runs on (`<cache>/precision/`). `auto` precision (cluster/precision/choice.py) reads it
before an engine starts; a replica whose bf16 engine failed its numerics check writes it and restarts.
A new vLLM version, another CPU or another model folder starts afresh; deleting the folder forgets.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from pathlib import Path

from cluster.hardware.cpu_caps import CpuCaps


class PrecisionMemory:
    def __init__(self, root: Path, source: str, caps: CpuCaps, engine_version: str) -> None:
        key = hashlib.sha256(f"{source}|{engine_version}".encode()).hexdigest()[:16]
        self._path = root / f"{key}-{caps.signature}.json"
        self._source = source
        self._caps = caps
        self._engine_version = engine_version

    @property
    def path(self) -> Path:
        return self._path

    def bf16_failed(self) -> str | None:
        try:
            data = json.loads(self._path.read_text())
        except (OSError, ValueError):
            return None
        reason = data.get("bf16_failed") if isinstance(data, dict) else None
        return str(reason) if reason else None

    def record_bf16_failure(self, reason: str) -> None:
        self._path.parent.mkdir(parents=True, exist_ok=True)
        data = {
            "bf16_failed": reason,
            "at": time.time(),
            "source": self._source,
            "cpu": self._caps.to_dict(),
            "engine": self._engine_version,
        }
        tmp = self._path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(data, indent=1) + "\n")
        tmp.replace(self._path)
