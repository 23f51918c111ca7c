"""Network exposure: no gateway listens beyond loopback without auth.

The refusal is part of config validation, so every command that reads a config (and the Serve
app builder, which re-validates the embedded config) stops before anything starts.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from cluster.config.deployment import dump_config, load_config, parse_config
from router.errors import ConfigError
from spillover.main import main

REPO = Path(__file__).resolve().parents[2]


def _config_file(tmp_path: Path, **gateway: object) -> Path:
    raw = yaml.safe_load((REPO / "configs/local.yaml").read_text())
    raw.setdefault("gateway", {}).update(gateway)
    path = tmp_path / "exposed.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


@pytest.mark.parametrize("command", [["config", "check"], ["serve"], ["deploy"], ["render"]])
@pytest.mark.parametrize("host", ["0.0.0.0", "::", "10.1.2.3", "head-node.internal"])
def test_item1_nonloopback_without_auth_refused(
    command: list[str], host: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = _config_file(tmp_path, host=host, auth=False)
    assert main([*command, "--config", str(path)]) == 2
    err = capsys.readouterr().err
    assert "gateway.host" in err and "gateway.auth" in err  # both fields named
    assert "gateway.auth: true" in err and "127.0.0.1" in err  # and the fix
    assert "Traceback" not in err


@pytest.mark.parametrize("host", ["127.0.0.1", "127.0.0.5", "::1", "[::1]", "localhost"])
def test_item1_loopback_without_auth_is_fine(host: str, tmp_path: Path) -> None:
    assert main(["config", "check", "--config", str(_config_file(tmp_path, host=host))]) == 0


def test_item1_nonloopback_with_auth_and_tenants_is_fine(tmp_path: Path) -> None:
    path = _config_file(tmp_path, host="0.0.0.0", auth=True)
    raw = yaml.safe_load(path.read_text())
    raw["tenants"] = [{"name": "apps", "api_key_env": "APPS_KEY"}]
    path.write_text(yaml.safe_dump(raw))
    assert main(["config", "check", "--config", str(path)]) == 0


def test_item1_deployed_config_is_refused_too() -> None:
    """`serve deploy` of a hand-edited Serve file re-validates the embedded config in the app builder."""
    raw = dump_config(load_config(REPO / "configs/local.yaml"))
    raw["gateway"]["host"] = "0.0.0.0"
    with pytest.raises(ConfigError) as caught:
        parse_config(raw, "(deployed config)")
    assert "gateway.auth" in caught.value.message


def test_item1_gpu_config_ships_with_auth_and_env_keys() -> None:
    config = load_config(REPO / "configs/gpu.yaml")
    assert config.gateway.host == "0.0.0.0" and config.gateway.auth is True
    assert config.tenants and all(t.api_key_env for t in config.tenants)
    assert any(t.admin for t in config.tenants)
    assert "sk-" not in (REPO / "configs/gpu.yaml").read_text()  # no key in the file
