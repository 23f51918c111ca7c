"""A provider's `base_url` carries its API key and every prompt: plain http is refused unless the host is
loopback (a cloud-sim, a local proxy) or the operator opts in with `allow_insecure_http: true`. The refusal
is config validation, so `spillover config check` (and serve, deploy, render) stops before anything starts.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from cluster.config.deployment import dump_config, load_config, parse_config
from router.errors import ConfigError
from spillover.main import main

REPO = Path(__file__).resolve().parents[2]


def _raw(base_url: str, **provider: Any) -> dict[str, Any]:
    raw = dump_config(load_config(REPO / "configs/local.yaml"))
    raw["cloud"]["providers"][0].update(base_url=base_url, **provider)
    return raw


@pytest.mark.parametrize(
    "url",
    [
        "http://api.openai.example/v1",
        "http://10.0.0.7:9100/v1",
        "http://127.0.0.1.evil.example/v1",
        "http://localhost.evil.example/v1",
        "http://[2001:db8::1]/v1",
    ],
)
def test_provider_base_url_must_be_https_unless_loopback(url: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_config(_raw(url), "test")
    (path, reason), *_ = caught.value.problems
    assert path == "cloud.providers[0].base_url"
    assert "https://" in reason and "allow_insecure_http: true" in reason  # the fix, named


@pytest.mark.parametrize(
    "url",
    [
        "https://api.openai.example/v1",
        "http://127.0.0.1:9100/v1",
        "http://127.5.6.7/v1",
        "http://localhost:9100/v1",
        "http://[::1]:9100/v1",
    ],
)
def test_provider_base_url_https_or_loopback_is_valid(url: str) -> None:
    assert parse_config(_raw(url), "test").cloud.providers[0].base_url == url


def test_provider_base_url_plain_http_with_the_operator_opt_in() -> None:
    config = parse_config(_raw("http://proxy.internal:8080/v1", allow_insecure_http=True), "test")
    assert config.cloud.providers[0].allow_insecure_http is True


# overlays, merged as docs/bench.md and scripts/bench-overhead merge them
OVERLAYS = {
    "bench-overhead.yaml": ["configs/bench-overhead.yaml"],
    "bench-overhead-shared.yaml": ["configs/bench-overhead.yaml", "configs/bench-overhead-shared.yaml"],
    "bench-overhead-direct.yaml": ["configs/bench-overhead.yaml", "configs/bench-overhead-direct.yaml"],
}


@pytest.mark.parametrize("path", sorted((REPO / "configs").glob("*.yaml")), ids=lambda p: p.name)
def test_provider_base_url_of_the_shipped_configs_stays_valid(path: Path) -> None:
    if path.name in OVERLAYS:
        load_config(REPO / "configs/local.yaml", [REPO / overlay for overlay in OVERLAYS[path.name]])
    else:
        load_config(path)


def test_provider_base_url_must_be_https_in_config_check(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "plain.yaml"
    path.write_text(yaml.safe_dump(_raw("http://api.example/v1")))
    assert main(["config", "check", "--config", str(path)]) == 2
    err = capsys.readouterr().err
    assert "cloud.providers[0].base_url" in err and "Traceback" not in err
