"""Config validation: good files load, bad ones name the file, the field path and why."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from cluster.config.deployment import dump_config, load_config, parse_config
from router.errors import ConfigError

REPO = Path(__file__).resolve().parents[2]

MINIMAL = {"models": [{"alias": "m", "source": "prepared:smollm2-135m-instruct", "family": "llama"}]}


def test_shipped_configs_load() -> None:
    local = load_config(REPO / "configs/local.yaml")
    gpu = load_config(REPO / "configs/gpu.yaml")
    assert [m.alias for m in local.models] == ["smollm2-135m-instruct"]
    assert local.models[0].engine_args["enable_prefix_caching"] is True
    assert {m.family for m in gpu.models} == {"qwen", "llama"}
    assert all(m.accelerator == "gpu" for m in gpu.models)
    assert local.cloud.providers[0].name == "cloud-sim" and local.cloud.providers[0].enabled is False


def test_defaults_and_prefix_caching_on_by_default() -> None:
    config = parse_config(MINIMAL, "x.yaml")
    assert config.models[0].engine_args == {"enable_prefix_caching": True}
    assert config.watermarks.kv_cache == 0.85
    assert config.watermarks_for("m") == config.watermarks


def test_round_trip_through_dump() -> None:
    config = load_config(REPO / "configs/gpu.yaml")
    assert parse_config(dump_config(config), "again") == config


@pytest.mark.parametrize(
    ("patch", "field", "reason"),
    [
        ({"models": []}, "(top level)", "nothing to serve: configure models (local) or routes"),
        ({"models": [{"alias": "m", "source": "s", "family": "mistral"}]}, "models[0].family", "'qwen' or 'llama'"),
        ({"models": [{**MINIMAL["models"][0], "replicas": 0}]}, "models[0].replicas", "greater than or equal to 1"),
        (
            {"models": [{**MINIMAL["models"][0], "engine_args": {"enable_prefix_caching": False}}]},
            "models[0].engine_args",
            "enable_prefix_caching must be true",
        ),
        ({"gateway": {"port": 70000}}, "gateway.port", "less than or equal to 65535"),
        ({"gateway": {"prot": 8000}}, "gateway.prot", "Extra inputs are not permitted"),
        ({"watermarks": {"kv_cache": 0.8, "low": 0.9}}, "watermarks", "low must be below"),
        ({"models": [MINIMAL["models"][0], MINIMAL["models"][0]]}, "models", "duplicate model aliases: m"),
        (
            {"cloud": {"providers": [{"name": "p", "base_url": "https://x/v1", "models": {"other": "x"}}]}},
            "cloud.providers[0].models",
            "maps unknown model aliases ['other']",
        ),
        ({"cloud": {"providers": [{"name": "p", "base_url": "ftp://x"}]}}, "cloud.providers[0].base_url", "pattern"),
    ],
)
def test_bad_config_names_field_and_reason(patch: dict, field: str, reason: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_config({**MINIMAL, **patch}, "deploy.yaml")
    err = caught.value
    assert err.path == "deploy.yaml"
    assert any(f == field and reason in r for f, r in err.problems), err.problems
    assert "deploy.yaml" in err.message and field in err.message


def test_yaml_syntax_error_names_line(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("models:\n  - alias: m\n    source: [unclosed\n")
    with pytest.raises(ConfigError) as caught:
        load_config(bad)
    assert caught.value.path == str(bad)
    assert "line" in caught.value.problems[0][0]


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as caught:
        load_config(tmp_path / "nope.yaml")
    assert "No such file" in caught.value.message


def test_top_level_must_be_mapping() -> None:
    with pytest.raises(ConfigError, match="expected a mapping"):
        parse_config(["models"], "list.yaml")


def test_calibrate_overlay_sets_admission_limit() -> None:
    overlay = REPO / "bench/reports/cpu-smollm2-calibrate/overlay.yaml"
    config = load_config(REPO / "configs/local.yaml", [overlay])
    assert config.models[0].admission_limit == 4
    assert config.models[0].engine_args["max_model_len"] == 4096  # the rest untouched


def test_overlay_with_unknown_alias_names_overlay(tmp_path: Path) -> None:
    overlay = tmp_path / "o.yaml"
    overlay.write_text("models:\n  - alias: nope\n    admission_limit: 3\ngateway:\n  port: 9000\n")
    with pytest.raises(ConfigError) as caught:
        load_config(REPO / "configs/local.yaml", [overlay])
    assert caught.value.path == str(overlay)
    assert caught.value.problems[0][0] == "models[0].alias" and "'nope'" in caught.value.problems[0][1]


def test_overlay_merges_sections(tmp_path: Path) -> None:
    overlay = tmp_path / "o.yaml"
    overlay.write_text("gateway:\n  port: 9000\n")
    config = load_config(REPO / "configs/local.yaml", [overlay])
    assert (config.gateway.port, config.gateway.host) == (9000, "127.0.0.1")


def test_gateway_autoscaling_and_resilience_sections_validate() -> None:
    scaled = {"autoscaling": {"min_replicas": 2, "max_replicas": 6}}
    ok = parse_config({**MINIMAL, "gateway": scaled, "state": {"url": "redis://10.0.0.1:6380/0"}}, "t")
    assert ok.gateway.autoscaling is not None and ok.gateway.autoscaling.max_replicas == 6
    with pytest.raises(ConfigError) as bad:
        parse_config({**MINIMAL, "gateway": {"autoscaling": {"min_replicas": 3, "max_replicas": 2}}}, "t")
    assert "max_replicas must be >= min_replicas" in str(bad.value)
    with pytest.raises(ConfigError) as ramp:
        parse_config({**MINIMAL, "resilience": {"health": {"ramp": [0.5, 0.2]}}}, "t")
    assert "resilience.health" in str(ramp.value) and "ramp" in str(ramp.value)
    with pytest.raises(ConfigError) as golden:
        parse_config({**MINIMAL, "models": [{**MINIMAL["models"][0], "golden": {"prompt": "x", "expect": "("}}]}, "t")
    assert "models[0].golden.expect" in str(golden.value)
    provider = {"name": "p", "base_url": "https://x/v1", "rpm": 60, "domain": "acct-1"}
    cfg = parse_config({**MINIMAL, "cloud": {"providers": [provider]}}, "t")
    assert cfg.cloud.providers[0].failure_domain == "acct-1"


@pytest.mark.parametrize(
    ("gateway", "field"),
    [({"replicas": 2}, "gateway.replicas"), ({"autoscaling": {"max_replicas": 3}}, "gateway.autoscaling.max_replicas")],
)
def test_several_gateway_replicas_without_a_shared_store_are_refused_naming_the_fix(
    gateway: dict[str, Any], field: str
) -> None:
    with pytest.raises(ConfigError) as refused:
        parse_config({**MINIMAL, "gateway": gateway}, "t")
    assert refused.value.problems[0][0] == "state.url"
    reason = refused.value.problems[0][1]
    assert field in reason and "state.url" in reason and "'local'" in reason and "redis://" in reason
    assert parse_config({**MINIMAL, "gateway": gateway, "state": {"url": "local"}}, "t").state.url == "local"
    assert parse_config({**MINIMAL, "gateway": {"replicas": 1}}, "t").state.url is None


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("redis://:hunter2@head:6380/0", "password_env"),
        ("http://head:6380", "not a Redis URL"),
        ("redis://:6380/0", "no host"),
        ("redis://head:99999/0", "bad port"),
        ("x" * 5000, "not a Redis URL"),
    ],
)
def test_a_bad_state_url_is_refused_and_a_password_in_it_never_echoed(url: str, says: str) -> None:
    with pytest.raises(ConfigError) as refused:
        parse_config({**MINIMAL, "state": {"url": url}}, "t")
    assert says in str(refused.value) and "hunter2" not in str(refused.value)
    assert len(str(refused.value)) < 2000


def test_state_password_env_must_be_a_variable_name() -> None:
    with pytest.raises(ConfigError) as refused:
        parse_config({**MINIMAL, "state": {"url": "redis://h:6380/0", "password_env": "X=1; rm -rf /"}}, "t")
    assert "state.password_env" in str(refused.value)


def test_the_cpu_default_is_calibrated_on_each_cpu_class_and_the_calibrating_overlay_removes_it() -> None:
    """configs/local.yaml routes with a fit and an SLO on either CPU these machines come with (an Intel Xeon with
    AMX, an AVX2-only AMD EPYC), both running float32 eager; `bench calibrate` serves it without them."""
    (spec,) = load_config(REPO / "configs/local.yaml").models
    for cpu in ("amx-bf16", "avx2"):
        fit, why = spec.fit_for([(cpu, "float32 eager")])
        assert fit is not None and fit.has_slo and fit.cpu == cpu, why
    fit, why = spec.fit_for([("avx512", "float32 eager")])
    assert fit is None and why is not None and "no perf fit for replicas on avx512" in why
    (bare,) = load_config(REPO / "configs/local.yaml", [REPO / "configs/overlays/calibrating.yaml"]).models
    assert bare.perf == [] and not bare.has_slo
