"""Ray Serve LLM's node initialisation, skipped for a model that is a folder on the replica's node.

Before an engine starts, ray.serve.llm runs one Ray task per node of the replica's placement group
(`initialize_remote_node`) to download the model's files from a cloud mirror. For a model folder already
on the node (every `prepared:` model, and any `source` path) that task downloads nothing and returns
the folder's path unchanged; but it needs a worker process with the replica's runtime environment, which
Ray starts for it: a new Python process importing Ray's LLM package, torch and transformers (about 15 s
of a core on the 2-core test machines) that then idles with its memory, at every replica start or
replacement. This callback tells ray.serve.llm to skip it when the model is such a folder. A hub id or a
cloud URI still runs it, as before: there the task is where a mirror is read.

The callback runs in the replica (ray.serve.llm's `CallbackBase`, set through `LLMConfig.callback_config`);
the folder is looked for on the replica's own node, which is where its engine runs.
"""

from __future__ import annotations

import os
from typing import Any

from ray.llm._internal.common.callbacks.base import CallbackBase  # ray.serve.llm's callback API

CALLBACK_PATH = "serve_apps.engine.node_init.LocalFolderNodeInit"


def is_local_folder(source: str) -> bool:
    """A model source vLLM loads from this node's disk (an absolute path to a folder with config.json)."""
    return os.path.isabs(source) and os.path.isfile(os.path.join(source, "config.json"))


class LocalFolderNodeInit(CallbackBase):
    """Skips the download task for a model that is a folder on this node (module docstring)."""

    async def on_before_node_init(self) -> None:
        loading: Any = self.llm_config.model_loading_config  # a ModelLoadingConfig once the LLMConfig is validated
        source = loading.get("model_source") if isinstance(loading, dict) else loading.model_source
        if isinstance(source, str) and is_local_folder(source):
            self.ctx.run_init_node = False
