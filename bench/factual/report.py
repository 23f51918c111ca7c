"""The record of a `bench factual` run, written to a directory (bench/calibrate/report.py's conventions):

results.json     everything: options, the set, the reference's provenance, every answer of every
                 run, summaries, the replicas' precision and numerics, the acceptance, environment
reference.json   the float32 reference's answers (when computed by this run): `--reference` reads it
report.md        for reading: accuracy per run and per topic, phrasing spread, the served replica,
                 the acceptance with every violation, then every prompt with each run's mark
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from bench.calibrate.report import environment_and_plots, write_results
from bench.factual.check import phrasing_spread, shared_loops, summarize_run
from bench.factual.prompt_set import SHARED_SYSTEM, TOPICS

if TYPE_CHECKING:
    from bench.factual.run import FactualRun


def _pct(value: float | None) -> str:
    return "–" if value is None else f"{value:.0%}"


def _cell(text: str | None, limit: int = 70) -> str:
    if text is None:
        return "–"
    flat = " ".join(text.split()).replace("|", "\\|")
    return flat if len(flat) <= limit else flat[: limit - 1] + "…"


def _replica_lines(replicas: dict[str, Any]) -> list[str]:
    rows = replicas.get("replicas") or []
    if not rows:
        return [f"Served replica: not readable ({replicas.get('error') or 'no replica of the model listed'})."]
    lines = ["| replica | precision | CPU class | numerics | fault |", "|---|---|---|---|---|"]
    notes = []
    for r in rows:
        lines.append(
            f"| {r.get('replica_id')} | {r.get('precision') or '–'} | {r.get('cpu_class') or '–'} | "
            f"{r.get('numerics') or '–'} | {r.get('fault') or '–'} |"
        )
        notes += [f"- {r.get('replica_id')}: {' '.join(str(note).split())}" for note in r.get("notes") or []]
    if notes:
        lines += ["", "What the replica says of itself:", "", *notes]
    after = replicas.get("after") or {}
    changed = [r for r in after.get("replicas") or [] if r not in rows]
    if changed:
        lines.append(
            "\nAfter the passes: "
            + "; ".join(f"{r.get('replica_id')} numerics {r.get('numerics')}, fault {r.get('fault')}" for r in changed)
            + "."
        )
    return lines


def render_markdown(run: FactualRun) -> str:
    o = run.options
    runs = {"reference": run.reference, **run.passes}
    shared = sum(1 for p in run.prompts if p.system)
    facts = len({(p.topic, p.fact) for p in run.prompts})
    where = f"through {o.url}" if o.url else "(reference only)"
    residency = "no residency header" if o.residency == "any" else f"`x-spillover-residency: {o.residency}`"
    lines = [
        f"# Factual check — `{o.model}` {where}",
        "",
        f"Started {run.started_at}. {len(run.prompts)} distinct prompts ({facts} facts in several phrasings, "
        f"bench/factual/prompt_set.py); {shared} of them start with the same {len(SHARED_SYSTEM.split())}-word system "
        f"prompt (prefix-cache hits). Greedy, at most {o.max_tokens} tokens. Reference: "
        f"{run.reference_info.get('engine', '–')} in {run.reference_info.get('dtype', '–')} on "
        f"`{run.reference_info.get('model_dir', '–')}`"
        + (f" (read from `{run.reference_info['read_from']}`)" if run.reference_info.get("read_from") else "")
        + f". Served: temperature 0, non-streamed, {residency}, one pass per concurrency level "
        f"({', '.join(run.passes) or 'none'}).",
        "",
        "## Served replica",
        "",
        *_replica_lines(run.replicas),
        "",
        "## Accuracy",
        "",
        "| run | answered | right | accuracy | degenerate | without answer | routes | cached prompt tokens |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for label, answers in runs.items():
        s = summarize_run(label, run.prompts, answers)
        routes = ", ".join(f"{k} ×{n}" for k, n in sorted(s.routes.items())) if label != "reference" else "–"
        lines.append(
            f"| {label} | {s.answered} | {s.right} | {_pct(s.accuracy)} | {s.degenerate} | {s.errors} | "
            f"{routes} | {_pct(s.cached_share)} |"
        )
    lines += ["", "| topic | prompts | " + " | ".join(runs) + " |", "|---|---|" + "---|" * len(runs)]
    for topic in TOPICS:
        subset = [p for p in run.prompts if p.topic == topic]
        if not subset:  # a --limit run
            continue
        rights = [sum(1 for p in subset if (a := answers.get(p.id)) and a.right) for answers in runs.values()]
        lines.append(f"| {topic} | {len(subset)} | " + " | ".join(str(n) for n in rights) + " |")
    lines += ["", "Facts asked in several phrasings, right in every phrasing / in some / in none:", ""]
    for label, answers in runs.items():
        spread = phrasing_spread(run.prompts, answers)
        lines.append(f"- {label}: {spread.all} / {spread.some} / {spread.none}")
    lines += ["", "## Acceptance", ""]
    found = run.violations
    right_ref = sum(1 for a in run.reference.values() if a.right)
    if o.reference_only:
        lines.append("Reference only: no served run to judge.")
    elif not found:
        lines.append(
            f"**PASSED**: every one of the {right_ref} prompts the float32 reference answers right was "
            f"answered right in every served pass ({', '.join(run.passes)}); no served answer degenerated "
            "where the reference did not."
        )
    else:
        lines.append(
            f'**FAILED**: {len(found)} violation(s) of "right wherever the float32 reference ({right_ref} '
            'prompts) is right, none degenerate":'
        )
        lines += [
            "",
            "| run | prompt | kind | question | expected | reference | served | detail |",
            "|---|---|---|---|---|---|---|---|",
        ]
        for v in found:
            lines.append(
                f"| {v.run} | {v.id} | {v.kind} | {_cell(v.question)} | {v.expected} | "
                f"{_cell(v.reference)} | {_cell(v.served)} | {_cell(v.detail)} |"
            )
    own_loops = shared_loops(run.prompts, run.reference, run.passes)
    if own_loops:
        ids = sorted({prompt_id for _, prompt_id in own_loops})
        lines += ["", f"The model's own loops, no violation: {len(own_loops)} served answer(s) loop on prompts where "
                  f"the float32 reference loops too ({', '.join(ids)})."]  # fmt: skip
    lines += ["", "## Every prompt", "", "✓ right, ✗ wrong, ∞ degenerate, – no answer.", ""]
    lines += [
        "| prompt | question | reference answer | " + " | ".join(runs) + " |",
        "|---|---|---|" + "---|" * len(runs),
    ]
    for p in run.prompts:
        ref = run.reference.get(p.id)
        marks = [_mark(answers.get(p.id)) for answers in runs.values()]
        question = ("[system] " if p.system else "") + p.question
        lines.append(f"| {p.id} | {_cell(question)} | {_cell(ref.text if ref else None)} | " + " | ".join(marks) + " |")
    lines += environment_and_plots(run.environment, [])
    return "\n".join(lines) + "\n"


def _mark(answer: Any) -> str:
    if answer is None or answer.text is None:
        return "–"
    if answer.degenerate:
        return "∞"
    return "✓" if answer.right else "✗"


def write_factual_report(run: FactualRun, out_dir: Path) -> dict[str, Path]:
    paths = write_results(out_dir, run.to_dict(), render_markdown(run))
    reference = out_dir / "reference.json"
    if reference.exists():
        paths["reference.json"] = reference
    return paths
