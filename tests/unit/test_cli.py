"""The CLI's argument and config handling (nothing here starts Ray)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cluster import models
from spillover.main import main

REPO = Path(__file__).resolve().parents[2]


def test_config_check_ok(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["config", "check", "--config", str(REPO / "configs/gpu.yaml")]) == 0
    assert "ok (2 model(s)" in capsys.readouterr().out


@pytest.mark.parametrize("command", [["config", "check"], ["serve"]])
def test_bad_config_exits_2_naming_file_and_field(
    command: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("models:\n  - alias: m\n    source: prepared:x\n    family: mistral\n")
    assert main([*command, "--config", str(bad)]) == 2
    err = capsys.readouterr().err
    assert str(bad) in err and "models[0].family" in err
    assert "Traceback" not in err


def test_models_list_json(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("SPILLOVER_CACHE", str(tmp_path))
    done = models.model_dir("qwen2-tiny-random")
    done.mkdir(parents=True)
    (done / models.MARKER).write_text("{}")
    (models.model_dir("smollm2-135m-instruct")).mkdir()  # a half-built folder without marker
    assert main(["models", "list", "--json"]) == 0
    rows = {r["name"]: r for r in json.loads(capsys.readouterr().out)}
    assert rows["qwen2-tiny-random"]["prepared"] is True
    assert rows["qwen2-tiny-random"]["synthetic"] is True
    assert rows["smollm2-135m-instruct"]["prepared"] is False
    assert rows["qwen2-tiny-random"]["path"] == str(tmp_path / "models" / "qwen2-tiny-random")


def test_prepare_is_instant_when_marker_present(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPILLOVER_CACHE", str(tmp_path))
    folder = models.model_dir("smollm2-135m-instruct")
    folder.mkdir(parents=True)
    (folder / models.MARKER).write_text("{}")
    (folder / "numerics-reference.json").write_text('{"version": 1, "prompts": [{"token_ids": [1]}]}')
    said: list[str] = []
    assert models.prepare("smollm2-135m-instruct", progress=lambda s, t, text: said.append(text)) == folder
    assert said == [f"smollm2-135m-instruct: already prepared at {folder}"]


def test_prepare_unknown_model_is_an_argument_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as caught:
        main(["models", "prepare", "gpt-5"])
    assert caught.value.code == 2
    assert "invalid choice" in capsys.readouterr().err


def test_with_cloud_sim_enables_only_that_provider() -> None:
    from cluster.config.deployment import load_config
    from spillover.main import with_cloud_sim

    config, port, names = with_cloud_sim(load_config(REPO / "configs/local.yaml"))
    assert (port, names) == (9100, ["sim-smollm2"])
    assert [p.enabled for p in config.cloud.providers if p.name == "cloud-sim"] == [True]


def test_serve_cloud_sim_without_provider_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["serve", "--cloud-sim", "--config", str(REPO / "configs/gpu.yaml")]) == 2
    assert "no provider named 'cloud-sim'" in capsys.readouterr().err


def test_with_cloud_sim_drops_an_unset_key_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    from cluster.config.deployment import load_config
    from spillover.main import with_cloud_sim

    monkeypatch.delenv("SPILLOVER_CLOUD_SIM_KEY", raising=False)
    config, _, _ = with_cloud_sim(load_config(REPO / "configs/local.yaml"))
    assert config.cloud.providers[0].api_key_env is None
    monkeypatch.setenv("SPILLOVER_CLOUD_SIM_KEY", "sk-set")
    config, _, _ = with_cloud_sim(load_config(REPO / "configs/local.yaml"))
    assert config.cloud.providers[0].api_key_env == "SPILLOVER_CLOUD_SIM_KEY"
