"""`spillover traffic`: the operator's traffic controls on a running gateway.

    spillover traffic show [--json]
    spillover traffic drain TARGET [--reason TEXT]          TARGET: local:<alias> | cloud:<provider>
    spillover traffic undrain TARGET
    spillover traffic pin MODEL TARGET [--scenario S]
    spillover traffic unpin MODEL [--scenario S]
    spillover traffic switch MODEL --primary P --standby T [--scenario S] [--step-s N] [--min-requests N]
                                   [--dry-run-file FILE]   FILE: JSON {messages, tools, response_format}
    spillover traffic rollback MODEL [--scenario S] [--reason TEXT]
    spillover traffic clear MODEL [--scenario S]

Each command is `POST /v1/spillover/traffic` (`show` is its GET) on the gateway; every gateway replica
follows it within `traffic.sync_period_s`. With `gateway.auth` on, an admin tenant's key is read from
`$SPILLOVER_API_KEY` (or the variable `--api-key-env` names), never from the command line.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from cluster.config.deployment import load_config
from router.errors import ClusterError
from spillover.gateway_client import add_key_argument, gateway_url, get_json

PATH = "/v1/spillover/traffic"


def add_traffic_parser(subparsers: Any) -> None:
    traffic = subparsers.add_parser("traffic", help="drain, pin, switch (graded, after a dry-run), roll back")
    sub = traffic.add_subparsers(dest="traffic_command", required=True)

    def command(name: str, text: str) -> argparse.ArgumentParser:
        parser: argparse.ArgumentParser = sub.add_parser(name, help=text)
        parser.add_argument("--config", default=None, help="config whose gateway to ask")
        parser.add_argument("--url", default=None, help="gateway base URL (default: from the config)")
        parser.add_argument("--json", action="store_true", help="print the gateway's whole answer as JSON")
        add_key_argument(parser)
        parser.set_defaults(func=cmd_traffic)
        return parser

    command("show", "the operator document and this replica's switches")
    for name, text in (("drain", "take no new requests on TARGET"), ("undrain", "give TARGET traffic again")):
        parser = command(name, text)
        parser.add_argument("target", metavar="TARGET", help="local:<alias> or cloud:<provider>")
        if name == "drain":
            parser.add_argument("--reason", default=None)
    pin = command("pin", "send MODEL (or one scenario of it) only to TARGET")
    pin.add_argument("model", metavar="MODEL")
    pin.add_argument("target", metavar="TARGET")
    pin.add_argument("--scenario", default=None)
    for name, text in (
        ("unpin", "undo a pin"),
        ("rollback", "send a switch's new target 0% again"),
        ("clear", "forget a switch (normal routing)"),
    ):
        parser = command(name, text)
        parser.add_argument("model", metavar="MODEL")
        parser.add_argument("--scenario", default=None)
        if name == "rollback":
            parser.add_argument("--reason", default=None)
    switch = command("switch", "move MODEL's traffic from PRIMARY to STANDBY by graded steps, after a dry-run")
    switch.add_argument("model", metavar="MODEL")
    switch.add_argument("--primary", required=True, help="where the traffic is now")
    switch.add_argument("--standby", required=True, help="where it moves (dry-run first)")
    switch.add_argument("--scenario", default=None)
    switch.add_argument("--step-s", type=float, default=None, help="hold each step at least this long")
    switch.add_argument("--min-requests", type=int, default=None, help="outcomes of the standby per step")
    switch.add_argument("--dry-run-file", type=Path, default=None, help="JSON sample: messages, tools, response_format")


def command_body(args: argparse.Namespace) -> dict[str, Any] | None:
    """The POST body of `args` (None for `show`)."""
    action = args.traffic_command
    if action == "show":
        return None
    fields = ("target", "model", "scenario", "reason", "primary", "standby", "step_s", "min_requests")
    body = {"action": action, **{f: getattr(args, f) for f in fields if getattr(args, f, None) is not None}}
    sample = getattr(args, "dry_run_file", None)
    if sample is not None:
        try:
            body["dry_run"] = json.loads(sample.read_text())
        except (OSError, ValueError) as exc:
            raise ClusterError(f"--dry-run-file {sample}: {exc}") from None
    return body


def cmd_traffic(args: argparse.Namespace) -> int:
    config = load_config(args.config)
    data = get_json(gateway_url(config, args.url), PATH, args.api_key_env, body=command_body(args))
    if args.json:
        print(json.dumps(data, indent=2, sort_keys=True))
        return 0
    if "result" in data:
        print(data["result"])
        data = data["traffic"]
    print(render(data))
    return 0


def render(doc: dict[str, Any]) -> str:
    lines = [f"version {doc.get('version', 0)}"]
    for target, drain in sorted(doc.get("drains", {}).items()):
        lines.append(f"drained  {target}  ({drain['reason']})")
    for scope, pin in sorted(doc.get("pins", {}).items()):
        lines.append(f"pinned   {scope} -> {pin['target']}")
    migrations = doc.get("migrations", {})
    for scope, switch in sorted(doc.get("switches", {}).items()):
        here = migrations.get(scope, {})
        share = f"{here['share']:.0%}" if "share" in here else "?"
        lines.append(f"switch   {scope}: {switch['primary']} -> {switch['standby']}  {switch['phase']}  at {share}")
        lines += [f"         {e['kind']}: {e['reason']}" for e in here.get("events", [])[-5:]]
    if len(lines) == 1:
        lines.append("no drains, pins or switches")
    return "\n".join(lines)
