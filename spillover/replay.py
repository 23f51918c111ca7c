"""`spillover replay --policy NEW.yaml --decisions LOG.jsonl`: what a new policy would change.

Reads a decision log (`gateway.decisions_log`; cluster/decision_log_reader.py, bounded) and re-runs the
new policy's contract pipeline over every recorded request (router/learning/replay.py, pure). NEW.yaml is a
whole deployment config, or a file with only a policy (then `--config` gives the models and providers).
Prints a table (or `--json`): per outcome, the moves old → new target, candidates newly removed and
why, the share sent to cloud and the expected cost, old and new; then the requests that change.
Text taken from the log is printed with its control characters escaped (`printable`): a record cannot
drive the terminal. Exit codes: 0 the guards hold, 1 a guard tripped (`--max-changed-pct`,
`--max-no-capable`), 2 bad input.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from typing import Any

from cluster.config.tenants import tenant_policies
from cluster.decision_log_reader import DEFAULT_MAX_BYTES, load_replay_config, read_decision_log
from router.learning.replay import ReplayGuards, ReplayReport, replay
from router.routing.capabilities import Registry
from spillover.terminal import printable

SHOWN_CHANGES = 50


def _at_least(low: float, kind: type) -> Any:
    def parse(text: str) -> Any:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
        if not value >= low:  # NaN fails too
            raise argparse.ArgumentTypeError(f"must be >= {low:g}")
        return value

    return parse


def add_replay_parser(subparsers: Any) -> None:
    p = subparsers.add_parser("replay", help="re-run a new policy over recorded decisions and report the changes")
    p.add_argument("--policy", required=True, metavar="NEW.yaml", help="a deployment config, or a file with a policy")
    p.add_argument("--decisions", required=True, metavar="LOG.jsonl", help="a decision log (gateway.decisions_log)")
    p.add_argument("--config", default=None, help="models and providers when NEW.yaml holds only a policy")
    p.add_argument("--json", action="store_true", help="the whole report as JSON")
    p.add_argument(
        "--max-changed-pct", type=_at_least(0.0, float), default=10.0, help="guard: at most this %% of requests change"
    )
    p.add_argument(
        "--max-no-capable", type=_at_least(0, int), default=0, help="guard: at most this many become no_capable_model"
    )
    p.add_argument("--max-bytes", type=_at_least(1, int), default=DEFAULT_MAX_BYTES, help="refuse larger decision logs")
    p.set_defaults(func=cmd_replay)


def render(report: ReplayReport, examples: list[str]) -> str:
    s = report.summary()
    head = f"replay of policy {s['policy_version']}: {s['replayed']} of {s['requests']} recorded requests replayed"
    if s["malformed_lines"]:
        head += f", {s['malformed_lines']} malformed log lines skipped"
    lines = [
        head,
        "",
        f"  {'outcome':<20} requests",
    ]
    lines += [f"  {k:<20} {v}" for k, v in s["outcomes"].items()]
    lines.append(f"  changed: {s['changed']} ({s['changed_pct']:.1f}%)")
    if s["moves"]:
        lines += ["", "  moves (old -> new target)"] + [f"    {k}: {v}" for k, v in s["moves"].items()]
    if s["newly_removed"]:
        lines += ["", "  candidates removed now (not in the record)"]
        lines += [f"    {k}: {v['requests']} requests ({v['reason']})" for k, v in s["newly_removed"].items()]
    share, cost = s["cloud_share"], s["expected_cost_usd"]
    lines += [
        "",
        f"  share to cloud:     {share['old'] * 100:.1f}% -> {share['new'] * 100:.1f}%",
        f"  expected cost:      ${cost['old']:.6f} -> ${cost['new']:.6f}",
    ]
    changed = report.changed
    if changed:
        lines += ["", f"  changed requests (first {min(len(changed), SHOWN_CHANGES)} of {len(changed)})"]
        for r in changed[:SHOWN_CHANGES]:
            why = f"  ({r.why})" if r.why else ""
            lines.append(f"    {r.request_id}: {r.old_target} -> {r.new_target or r.outcome}{why}")
    skipped = [r for r in report.requests if r.outcome == "skipped"]
    if skipped or examples:
        lines += ["", "  not replayed"]
        lines += [f"    {r.request_id}: {r.why}" for r in skipped[:SHOWN_CHANGES]]
        lines += [f"    {e}" for e in examples]
    lines.append("")
    tripped = s["tripped"]
    lines.append("guards: " + ("TRIPPED: " + "; ".join(tripped) if tripped else "ok"))
    return "\n".join(printable(line) for line in lines)


def write_json(report: ReplayReport, write: Callable[[str], Any]) -> None:
    """The report as one JSON document, written a request at a time (never the whole list in memory);
    `json.dumps` escapes every control character, so nothing raw reaches a terminal."""
    summary = json.dumps(report.summary(), indent=2).replace("\n", "\n  ")
    write('{\n  "summary": ' + summary + ',\n  "requests": [')
    for i, request in enumerate(report.requests):
        write(("," if i else "") + "\n    " + json.dumps(request.to_dict()))
    write("\n  ]\n}\n")


def cmd_replay(args: argparse.Namespace) -> int:
    config = load_replay_config(args.policy, args.config)
    log = read_decision_log(args.decisions, max_bytes=args.max_bytes)
    registry = Registry.from_config(config.models, config.cloud.providers)
    tenants = {t.name: t for t in tenant_policies(config)}
    guards = ReplayGuards(max_changed_pct=args.max_changed_pct, max_no_capable=args.max_no_capable)
    report = replay(
        log.records,
        log.blobs,
        config.policy,
        registry,
        tenants=tenants,
        guards=guards,
        malformed=log.malformed,
        notes=log.examples,
    )
    if args.json:
        write_json(report, sys.stdout.write)
    else:
        print(render(report, log.examples))
    return 1 if report.tripped else 0
