"""ray.serve.llm's node initialisation is skipped only for a model that is a folder on the replica's node
(serve_apps/engine/llm.py): there its download task would return the folder unchanged."""

from __future__ import annotations

import asyncio
from pathlib import Path
from types import SimpleNamespace

from cluster.config.model_spec import ModelSpec
from serve_apps.engine.llm import CALLBACK_PATH, LocalFolderNodeInit, is_local_folder, llm_config_for


def _runs_init_node(source: str) -> bool:
    config = SimpleNamespace(model_loading_config=SimpleNamespace(model_source=source))
    callback = LocalFolderNodeInit(llm_config=config)
    asyncio.run(callback.on_before_node_init())
    return bool(callback.ctx.run_init_node)


def test_a_prepared_folder_skips_the_download_task(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text("{}")
    assert is_local_folder(str(tmp_path))
    assert not _runs_init_node(str(tmp_path))


def test_hub_ids_cloud_uris_and_folders_missing_here_still_run_it(tmp_path: Path) -> None:
    for source in ("Qwen/Qwen2.5-7B-Instruct", "s3://bucket/model", str(tmp_path / "absent"), str(tmp_path)):
        assert _runs_init_node(source), source  # tmp_path itself has no config.json: not a model folder


def test_every_model_config_names_the_callback() -> None:
    spec = ModelSpec(alias="m", source="/models/m", family="llama", accelerator="cpu")
    assert llm_config_for(spec, "/models/m").callback_config.callback_class == CALLBACK_PATH
