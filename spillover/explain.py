"""`spillover explain REQUEST_ID`: one request's decision record, readably.

Reads `GET /v1/spillover/decisions/{request_id}` from the gateway: the policy version, what the
request needed (its contract), every candidate with the filter that removed it or its scores,
the ranked tiers, the chosen target and every attempt with its outcome, latency, tokens, cost.
"""

from __future__ import annotations

import argparse
import json
from typing import Any
from urllib.parse import quote

from cluster.config.deployment import load_config
from spillover.gateway_client import add_key_argument, gateway_url, get_json
from spillover.terminal import printable

NEEDS = ("needs_tools", "needs_parallel_tools", "needs_json_schema", "needs_json_mode", "needs_streaming")


def add_explain_parser(subparsers: Any) -> None:
    explain = subparsers.add_parser("explain", help="show why a request went where it went")
    explain.add_argument("request_id")
    explain.add_argument("--config", default=None, help="config whose gateway to ask")
    explain.add_argument("--url", default=None, help="gateway base URL (default: from the config)")
    explain.add_argument("--json", action="store_true")
    add_key_argument(explain)
    explain.set_defaults(func=cmd_explain)


def render(record: dict[str, Any]) -> str:
    contract = record.get("contract", {})
    needs = [n.removeprefix("needs_") for n in NEEDS if contract.get(n)]
    lines = [
        f"request {record['request_id']}  (policy version {record['policy_version']})",
        f"  contract: model {contract.get('model')}, scenario {contract.get('scenario')}, "
        f"level {contract.get('level')}, strategy {contract.get('strategy')}, needs {', '.join(needs) or 'text only'}, "
        f"~{contract.get('est_prompt_tokens')} prompt + {contract.get('max_output_tokens')} output tokens, "
        f"residency {contract.get('residency')}",
        "  candidates:",
    ]
    for c in record.get("candidates", []):
        if c["status"] == "removed":
            lines.append(f"    {c['target']:<40} removed by {c['filter']}: {c['reason']}")
        elif c["status"] == "unavailable":
            lines.append(f"    {c['target']:<40} unavailable: {c.get('reason')}")
        else:
            scores = ", ".join(f"{k} {v['score']:.2f}" for k, v in (c.get("scores") or {}).items())
            lines.append(f"    {c['target']:<40} ranked {c['total']:.3f} ({scores})")
    tiers = " | ".join(", ".join(t) or "-" for t in record.get("tiers", []))
    lines.append(f"  tiers (local | cloud): {tiers}")
    lines.append(f"  chosen: {record.get('chosen') or 'none'}")
    if record.get("route"):
        wait = ""
        if record.get("waited_s") or record.get("replans"):
            waited, replans = record.get("waited_s", 0), record.get("replans", 0)
            wait = f" after {waited:.2f}s waiting for local room ({replans} re-plans)"
        lines.append(f"  route: {record['route']}{wait}: {record.get('reason') or '-'}")
    if record.get("traffic"):
        lines.append(f"  graded switch: {record['traffic']}")
    for i, a in enumerate(record.get("attempts", []), 1):
        cost = "unpriced" if a.get("cost_usd") is None else f"${a['cost_usd']:.6f}"
        error = f" ({a['error']})" if a.get("error") else ""
        counted = " (counted from the stream)" if a.get("usage") == "counted" else ""
        flag = f", output contract: {a['contract']}" if a.get("contract") else ""
        lines.append(
            f"  attempt {i}: {a['target']} -> {a['outcome']}{error} in {a['latency_s']:.3f}s, "
            f"{a['prompt_tokens']}+{a['completion_tokens']} tokens{counted}, {cost}{flag}"
        )
    if record.get("total_cost_usd") is not None:
        lines.append(f"  total cost (failures included): ${record['total_cost_usd']:.6f}")
    return "\n".join(printable(line) for line in lines)  # ids, reasons and targets come from clients


def cmd_explain(args: argparse.Namespace) -> int:
    config = load_config(args.config)
    url = gateway_url(config, args.url)
    record = get_json(url, f"/v1/spillover/decisions/{quote(args.request_id, safe='')}", args.api_key_env)
    print(json.dumps(record, indent=2) if args.json else render(record))
    return 0
