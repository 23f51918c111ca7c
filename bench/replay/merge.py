"""`bench replay --merge DIR...`: one report from replays of the same arrivals against differently configured
gateways.

A policy that is a gateway's configuration (the watermarks as shipped, the calibrated limit, the deadline-aware
or the load-proportional spill) needs its own `spillover serve`, so it is replayed in a run of its own; these
runs are one experiment only when they replayed the same requests at the same times. The merge checks that
(model, trace, scaling with its seed, the replayed window, SLO, deadline header, drain, prices) and refuses
runs that differ — naming the field — or that reuse a policy label; it then writes one results.json, table and
plot, with the offline bound of the runs that have one (they agree, or the merge is refused) and every run's
environment kept beside the first's.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.replay.run import ReplayError

SAME = ("model", "scaling", "window", "prompts_capped", "slo_s", "send_deadline", "drain_s", "prices")
MAX_RESULTS_BYTES = 64 << 20


def read_results(folder: Path) -> dict[str, Any]:
    path = folder / "results.json" if folder.is_dir() else folder
    try:
        if path.stat().st_size > MAX_RESULTS_BYTES:
            raise ReplayError(f"--merge {path}: larger than {MAX_RESULTS_BYTES >> 20} MiB, not a replay's results", 2)
        data = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError) as exc:
        raise ReplayError(f"--merge {path}: cannot read it ({type(exc).__name__})", 2) from None
    except json.JSONDecodeError as exc:
        raise ReplayError(f"--merge {path}: not JSON (line {exc.lineno})", 2) from None
    needed = (*SAME, "trace", "policies", "offline_bound", "environment", "started_at", "url")
    if not isinstance(data, dict) or any(key not in data for key in needed):
        raise ReplayError(f"--merge {path}: not the results.json of a `bench replay`", 2)
    if not isinstance(data["policies"], list) or not isinstance(data["trace"], dict):
        raise ReplayError(f"--merge {path}: not the results.json of a `bench replay`", 2)
    return data


def merge_results(folders: list[Path]) -> dict[str, Any]:
    """The merged results of the replays in `folders` (each a run's output folder or its results.json)."""
    if len(folders) < 2:
        raise ReplayError("--merge needs at least two replays' folders", 2)
    runs = [read_results(folder) for folder in folders]
    first = runs[0]
    for folder, run in zip(folders[1:], runs[1:], strict=True):
        for key in SAME:
            if run[key] != first[key]:
                raise ReplayError(f"--merge {folder}: {key} differs from {folders[0]}'s: not the same arrivals", 2)
        if Path(run["trace"].get("path", "")).name != Path(first["trace"].get("path", "")).name:
            raise ReplayError(f"--merge {folder}: another trace than {folders[0]}'s", 2)
    labels = [p.get("label") for run in runs for p in run["policies"] if isinstance(p, dict)]
    repeated = sorted({str(label) for label in labels if labels.count(label) > 1})
    if repeated:
        raise ReplayError(f"--merge: policy label(s) {', '.join(repeated)} in more than one run (use --label)", 2)
    bounds = [run["offline_bound"] for run in runs if run["offline_bound"] is not None]
    if any(_bound_figures(b) != _bound_figures(bounds[0]) for b in bounds[1:]):
        raise ReplayError("--merge: the runs' offline bounds differ (another fit or replica count)", 2)
    return {
        **first,
        "started_at": min(str(run["started_at"]) for run in runs),
        "offline_bound": bounds[0] if bounds else None,
        "policies": [p for run in runs for p in run["policies"]],
        "merged_from": [str(folder) for folder in folders],
        "environments": [run["environment"] for run in runs],
    }


def _bound_figures(bound: Any) -> Any:
    return (bound.get("requests"), bound.get("share")) if isinstance(bound, dict) else bound


@dataclass(frozen=True)
class MergeOutcome:
    results: dict[str, Any]
    paths: dict[str, Path]
    exit_code: int = 0


def run_merge(folders: list[str], out_dir: str | None) -> MergeOutcome:
    from bench.replay.report import write_results  # matplotlib: only when writing

    results = merge_results([Path(f) for f in folders])
    out = Path(out_dir) if out_dir else Path("bench/results") / f"replay-merged-{time.strftime('%Y%m%d-%H%M%S')}"
    return MergeOutcome(results, write_results(results, out))


def merge_summary_lines(outcome: MergeOutcome) -> list[str]:
    r = outcome.results
    lines = [f"merged {len(r['merged_from'])} replays of {r['trace']['path']}: {r['window']['requests']} requests"]
    for p in r["policies"]:
        m = p["metrics"]
        share = "-" if m["cloud_share"] is None else f"{m['cloud_share']:.0%}"
        lines.append(
            f"  {p['label']}: SLO attainment {m['slo_attainment']:.1%} ({m['in_slo']}/{m['sent']}), cloud share "
            f"{share}, spend ${m['spend_usd']:.4f}"
        )
    lines.append(f"  report: {outcome.paths['report.md']}")
    return lines
