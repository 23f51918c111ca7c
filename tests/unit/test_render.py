"""The Serve config `spillover render` writes and `spillover deploy` applies (cluster/render.py).

What it must reproduce of Serve (ray 2.60, `deploy_utils.get_app_code_version`): Serve hashes an
application's `import_path`, `runtime_env` and `args` into its code version and restarts every
replica when that changes, while a `deployments:` entry's `num_replicas` only resizes that
deployment. So scaling the gateway must not change `args`, and a code upgrade must.
"""

from __future__ import annotations

from pathlib import Path

from ray.serve._private.deploy_utils import get_app_code_version
from ray.serve.schema import ServeApplicationSchema, ServeDeploySchema

from cluster.config.deployment import load_config, parse_config
from cluster.render import GATEWAY_DEPLOYMENT, application, code_fingerprint, serve_config

REPO = Path(__file__).resolve().parents[2]


def local(**gateway: object) -> dict:
    raw = {
        "models": [{"alias": "m", "source": "prepared:x", "family": "llama"}],
        "gateway": gateway,
        "state": {"url": "redis://10.0.0.1:6380/0"},  # several gateway replicas need a shared store
    }
    return application(parse_config(raw, "test"), "configs/x.yaml", code="c0")


def test_gateway_replicas_live_in_deployments_so_scaling_keeps_the_code_version() -> None:
    one, three = local(replicas=1), local(replicas=3)
    assert one["args"] == three["args"] and one["args"]["config_data"]["gateway"]["replicas"] == 1
    assert three["deployments"] == [{"name": GATEWAY_DEPLOYMENT, "num_replicas": 3}]
    versions = {get_app_code_version(ServeApplicationSchema.model_validate(a)) for a in (one, three)}
    assert len(versions) == 1  # Serve resizes the gateway; the engines keep running


def test_other_changes_and_code_upgrades_change_the_code_version() -> None:
    base = ServeApplicationSchema.model_validate(local())
    changed = ServeApplicationSchema.model_validate(local(request_timeout_s=60))
    upgraded = ServeApplicationSchema.model_validate({**local(), "args": {**local()["args"], "code": "c1"}})
    assert len({get_app_code_version(a) for a in (base, changed, upgraded)}) == 3


def test_autoscaling_stays_in_the_embedded_config() -> None:
    app = local(autoscaling={"min_replicas": 1, "max_replicas": 3})
    assert app["deployments"] == []
    assert app["args"]["config_data"]["gateway"]["autoscaling"]["max_replicas"] == 3


def test_the_shipped_configs_render_to_valid_serve_configs() -> None:
    for name in ("local.yaml", "gpu.yaml", "gpu-sim.yaml"):
        path = REPO / "configs" / name
        rendered = ServeDeploySchema.model_validate(serve_config(load_config(str(path)), str(path)))
        assert [a.name for a in rendered.applications] == ["spillover"]


def test_code_fingerprint_follows_the_deployed_sources(tmp_path: Path) -> None:
    for package in ("router", "cluster", "serve_apps"):
        (tmp_path / package).mkdir()
        (tmp_path / package / "a.py").write_text("x = 1\n")
    first = code_fingerprint(tmp_path)
    assert code_fingerprint(tmp_path) == first
    (tmp_path / "serve_apps" / "a.py").write_text("x = 2\n")
    assert code_fingerprint(tmp_path) != first
    (tmp_path / "serve_apps" / "a.py").write_text("x = 1\n")
    (tmp_path / "bench").mkdir()
    (tmp_path / "bench" / "b.py").write_text("not deployed\n")
    assert code_fingerprint(tmp_path) == first
