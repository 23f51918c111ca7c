"""The `spillover` command line.

    spillover serve [--config configs/local.yaml] [--overlay PATH] [--cloud-sim]   run the stack here
    spillover deploy [--config PATH] [--address A]    deploy to a running Ray cluster, leave it running
    spillover render [--config PATH] [--out FILE]     the Serve config file for `serve deploy`
    spillover models prepare NAME [NAME ...]          build model folders in the cache
    spillover models list [--json]                    what is prepared and where
    spillover config check [--config PATH]            validate a config file
    spillover status [--config PATH] [--url URL] [--json]   live replicas, KV usage, saturation
    spillover cloud-sim [--port 9100] [fault flags]   OpenAI-compatible cloud simulator
    spillover bench calibrate --url URL --model NAME ...   load test, knee, admission-limit overlay
    spillover explain REQUEST_ID [--url URL] [--json]   why a request went where it went
    spillover traffic show|drain|undrain|pin|unpin|switch|rollback|clear ...   operator traffic controls
    spillover replay --policy NEW.yaml --decisions LOG.jsonl [--json]   what a new policy would change
    spillover capacity [--config PATH] [--prompt-tokens N] [--output-tokens M] [--gpu-mem 80GiB] [--json]

Exit codes: 0 ok, 2 bad input (config, arguments), 1 anything else.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
import time
from contextlib import ExitStack
from pathlib import Path
from urllib.parse import urlsplit

import yaml

from bench.cli import add_bench_parser
from bench.cloud_sim import add_cloud_sim_parser
from bench.cloud_sim.process import running_cloud_sim
from cluster.capacity.bound import calibration_line
from cluster.config.deployment import DEFAULT_CONFIG, SpilloverConfig, default_config_path, load_config
from cluster.models import CATALOG, list_prepared, prepare
from cluster.render import serve_config
from router.errors import ConfigError, SpilloverError
from router.routing.capabilities import provider_model_name
from spillover.capacity import add_capacity_parser
from spillover.explain import add_explain_parser
from spillover.replay import add_replay_parser
from spillover.status import add_status_parser
from spillover.traffic import add_traffic_parser

CLOUD_SIM = "cloud-sim"
OVERLAY_HELP = "config overlay merged on top (repeatable), e.g. the overlay.yaml `bench calibrate` writes"


def _say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def _say_calibration(config: SpilloverConfig) -> None:
    for spec in config.models:
        _say(calibration_line(spec.alias, spec.perf, spec.admission_limit))


def with_cloud_sim(config: SpilloverConfig) -> tuple[SpilloverConfig, int, list[str]]:
    """The config with its `cloud-sim` provider enabled, the simulator's port and model names."""
    provider = next((p for p in config.cloud.providers if p.name == CLOUD_SIM), None)
    if provider is None:
        raise ConfigError("(--cloud-sim)", [("cloud.providers", f"no provider named {CLOUD_SIM!r} to start")])
    port = urlsplit(provider.base_url).port or 80
    update: dict[str, object] = {"enabled": True}
    if provider.api_key_env and not os.environ.get(provider.api_key_env):
        # The simulator we start asks for no key; without this the adapter would refuse to send
        # (provider_not_configured) because the configured key variable is unset.
        _say(f"{provider.api_key_env} is not set: calling the local cloud-sim without an API key")
        update["api_key_env"] = None
    enabled = provider.model_copy(update=update)
    providers = [enabled if p.name == CLOUD_SIM else p for p in config.cloud.providers]
    config = config.model_copy(update={"cloud": config.cloud.model_copy(update={"providers": providers})})
    return config, port, sorted({provider_model_name(entry) for entry in provider.models.values()})


def cmd_serve(args: argparse.Namespace) -> int:
    os.environ.setdefault("RAY_DEDUP_LOGS", "1")
    logging.getLogger("httpx").setLevel(logging.WARNING)  # no line per readiness poll
    config = load_config(args.config, args.overlay)
    with ExitStack() as stack:
        if args.cloud_sim:
            config, port, names = with_cloud_sim(config)
            _say(f"starting cloud-sim on port {port} (models: {', '.join(names)})")
            stack.enter_context(running_cloud_sim(port, names))
        return _serve(config, args)


def _client_url(config: SpilloverConfig, proxy_url: str) -> str:
    """Where clients call: the gateway replicas' own listener (gateway.direct_port, no proxy hop) when set,
    on the node that runs them (gateway.resources places them; docs/architecture.md "Ingress"), else Serve's
    proxy."""
    if config.gateway.direct_port is None:
        return proxy_url
    return proxy_url.rsplit(":", 1)[0] + f":{config.gateway.direct_port}"


def _serve(config: SpilloverConfig, args: argparse.Namespace) -> int:
    from serve_apps.runner import deploy  # heavy imports (ray, vllm) only when serving

    _say(f"spillover serve: {args.config} ({len(config.models)} model(s), {len(config.routes)} route(s))")
    _say_calibration(config)
    running = deploy(config, args.config, _say)
    first = config.served_names[0]
    url = _client_url(config, running.base_url)
    print(f"\nspillover is serving at {url}/v1  (models: {', '.join(config.served_names)})")
    if url != running.base_url:
        print(f"  and through Serve's proxy at {running.base_url}/v1 (one hop more per request)")
    print("try:")
    print(f"  curl -s {url}/v1/chat/completions -H 'content-type: application/json' \\")
    print(
        f'    -d \'{{"model": "{first}", "messages": [{{"role": "user", "content": '
        f'"What is the capital of France?"}}], "temperature": 0}}\''
    )
    print("Ctrl-C stops it.", flush=True)
    stop = {"now": False}

    def on_signal(signum: int, frame: object) -> None:
        stop["now"] = True

    signal.signal(signal.SIGTERM, on_signal)
    try:
        while not stop["now"]:
            time.sleep(0.5)
    except KeyboardInterrupt:
        pass
    _say("shutting down Serve and Ray ...")
    running.stop()
    _say("stopped.")
    return 0


def cmd_deploy(args: argparse.Namespace) -> int:
    """Deploy to a running Ray cluster and leave it running (unlike `serve`)."""
    logging.getLogger("httpx").setLevel(logging.WARNING)
    config = load_config(args.config, args.overlay)
    address = args.address or config.cluster.address or "auto"
    config = config.model_copy(update={"cluster": config.cluster.model_copy(update={"address": address})})
    from serve_apps.runner import deploy

    _say(f"spillover deploy: {args.config} -> Ray at {address}")
    _say_calibration(config)
    running = deploy(config, args.config, _say)
    url = _client_url(config, running.base_url)
    print(f"deployed: {url}/v1 (models: {', '.join(config.served_names)})")
    if url != running.base_url:
        print(f"  and through Serve's proxy at {running.base_url}/v1 (one hop more per request)")
    print("it keeps running; `serve shutdown` (Ray's CLI) removes it.")
    return 0


def cmd_render(args: argparse.Namespace) -> int:
    config = load_config(args.config, args.overlay)
    text = "# Serve config written by `spillover render` from " + args.config + "\n"
    text += "# Deploy with: serve deploy <this file>   (on a node of the running Ray cluster)\n"
    text += yaml.safe_dump(serve_config(config, args.config), sort_keys=False)
    if args.out:
        Path(args.out).write_text(text)
        _say(f"wrote {args.out}")
    else:
        print(text, end="")
    return 0


def cmd_models_prepare(args: argparse.Namespace) -> int:
    for name in args.names:
        path = prepare(name)
        print(f"{name}: {path}")
    return 0


def cmd_models_list(args: argparse.Namespace) -> int:
    rows = list_prepared()
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    width = max(len(str(r["name"])) for r in rows)
    for r in rows:
        state = "prepared" if r["prepared"] else "missing "
        print(f"{r['name']:<{width}}  {state}  {r['path']}")
        print(f"{'':<{width}}  {r['description']}")
    return 0


def cmd_config_check(args: argparse.Namespace) -> int:
    config = load_config(args.config)
    print(f"{args.config}: ok ({len(config.models)} model(s), {len(config.cloud.providers)} cloud provider(s))")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="spillover", description="Self-hosted LLM serving with cloud burst.")
    sub = parser.add_subparsers(dest="command", required=True)

    serve = sub.add_parser("serve", help="run Ray + vLLM + the gateway on this machine")
    serve.add_argument("--config", default=None, help=f"deployment config (default {DEFAULT_CONFIG})")
    serve.add_argument("--overlay", action="append", default=[], metavar="PATH", help=OVERLAY_HELP)
    serve.add_argument(
        "--cloud-sim", action="store_true", help="also start the cloud simulator and enable the `cloud-sim` provider"
    )
    serve.set_defaults(func=cmd_serve)

    deploy = sub.add_parser("deploy", help="deploy to a running Ray cluster (ray start / ray up) and exit")
    deploy.add_argument("--config", default=None)
    deploy.add_argument("--overlay", action="append", default=[], metavar="PATH", help=OVERLAY_HELP)
    deploy.add_argument("--address", default=None, help="Ray address (default: the config's, else auto)")
    deploy.set_defaults(func=cmd_deploy)

    render = sub.add_parser("render", help="write the equivalent Serve config file for `serve deploy`")
    render.add_argument("--config", default=None)
    render.add_argument("--overlay", action="append", default=[], metavar="PATH", help=OVERLAY_HELP)
    render.add_argument("--out", default=None, help="file to write (default: stdout)")
    render.set_defaults(func=cmd_render)

    models = sub.add_parser("models", help="prepare and list local model folders")
    models_sub = models.add_subparsers(dest="models_command", required=True)
    prep = models_sub.add_parser("prepare", help="build model folders in the cache (idempotent)")
    prep.add_argument(
        "names", nargs="+", choices=sorted(CATALOG), metavar="NAME", help=f"one of: {', '.join(sorted(CATALOG))}"
    )
    prep.set_defaults(func=cmd_models_prepare)
    lst = models_sub.add_parser("list", help="show prepared models and their folders")
    lst.add_argument("--json", action="store_true")
    lst.set_defaults(func=cmd_models_list)

    add_status_parser(sub)
    add_explain_parser(sub)
    add_traffic_parser(sub)
    add_replay_parser(sub)
    add_capacity_parser(sub)
    add_cloud_sim_parser(sub)
    add_bench_parser(sub)

    config = sub.add_parser("config", help="config file tools")
    config_sub = config.add_subparsers(dest="config_command", required=True)
    check = config_sub.add_parser("check", help="validate a config file")
    check.add_argument("--config", default=None)
    check.set_defaults(func=cmd_config_check)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if getattr(args, "config", "unset") is None:
        args.config = default_config_path()
    try:
        return int(args.func(args))
    except ConfigError as exc:
        _say(f"error: {exc.message}")
        return 2
    except SpilloverError as exc:
        _say(f"error: {exc.message}")
        return 1
    except KeyboardInterrupt:
        _say("interrupted")
        return 130


if __name__ == "__main__":
    sys.exit(main())
