"""The compute model's part of a calibration report (bench/calibrate/fit.py's outcome): the fitted parameters,
each fit point predicted vs measured, and the held-out table of predicted vs measured knees."""

from __future__ import annotations

import statistics

from bench.calibrate.fit import ComputeOutcome, relative, stage_points
from bench.calibrate.sweep import StageResult
from cluster.capacity.engine_sim import Protocol

GOAL = 0.15  # held-out knees within ±15% of the measured ones


def _knee(value: int | None) -> str:
    return "–" if value is None else str(value)


def compute_lines(outcome: ComputeOutcome | None, error: str | None, main: StageResult | None) -> list[str]:
    if outcome is None:
        return ["", "## Compute model", "", f"The fit failed: {error}."] if error else []
    p, limits = outcome.fit.params, outcome.limits
    lines = [
        "",
        "## Compute model",
        "",
        "Step time t(n, p) = a + b·n + g·p, run through vLLM's scheduler (token budget "
        f"{limits.max_num_batched_tokens}, max_num_seqs {limits.max_num_seqs}: {limits.source}; "
        "chunked prefill) for each level's own closed loop; p95 = tail × simulated p95 (docs/capacity.md).",
        "",
        "| parameter | fitted |",
        "|---|---|",
        f"| c request_overhead_s | {p.request_overhead_s:.4g} |",
        f"| a step_s | {p.step_s:.4g} |",
        f"| b per_sequence_s | {p.per_sequence_s:.4g} |",
        f"| g per_prefill_token_s | {p.per_prefill_token_s:.4g} |",
        f"| tail_e2e (measured / simulated p95) | {p.tail_e2e:.3g} |",
        f"| tail_ttft (measured / simulated p95) | {p.tail_ttft:.3g} |",
        "",
        f"Fitted on {len(outcome.fit.residuals)} levels ({', '.join(s.name for s in outcome.fit_stages)} and the "
        f"main sweep); RMS relative error {outcome.fit.rms_relative_error:.1%}; the chat template adds "
        f"{outcome.template_tokens:.0f} prompt tokens to the words sent.",
        "",
        "| run | N | requests | prompt tok | cached | output tok | TTFT meas / pred | TPOT meas / pred | "
        "E2E meas / pred | E2E error | E2E p95 meas / pred |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in outcome.fit.residuals:
        q = r.point
        tpot = "–" if q.tpot_s is None else f"{q.tpot_s:.3g} / {r.tpot_s:.3g}"
        p95 = "–" if q.e2e_p95_s is None else f"{q.e2e_p95_s:.3g} / {r.e2e_p95_s * p.tail_e2e:.3g}"
        lines.append(
            f"| {q.label} | {q.concurrency} | {q.requests} | {q.prompt_tokens:.0f} | {q.cached_share:.0%} | "
            f"{q.output_tokens:.0f} | {q.ttft_s:.3g} / {r.ttft_s:.3g} | {tpot} | {q.e2e_s:.3g} / {r.e2e_s:.3g} | "
            f"{relative(r.e2e_error)} | {p95} |"
        )
    slo = f"{outcome.slo_metric} p95 ≤ {outcome.slo_p95_s:g} s"
    if main is not None and (points := stage_points(main)):
        prompt = statistics.fmean(q.prompt_tokens for q in points)
        output = statistics.fmean(q.output_tokens for q in points)
        share = statistics.fmean(q.cached_share for q in points)
        lines += [
            "",
            f"Main workload (in the fit): {prompt:.0f} prompt tokens, {output:.0f} output, for {slo}: the model's "
            f"knee {_knee(outcome.knee_for(prompt, output, share, main.plan.protocol))}, measured "
            f"{_knee(main.knee.concurrency)} (both for the sweep's own closed loop); for the default protocol "
            f"({Protocol().waves} × N requests, as `spillover capacity` and the gateway use) the model's knee is "
            f"{_knee(outcome.knee_for(prompt, output, share))}.",
        ]
    if outcome.holdouts:
        lines += [
            "",
            f"### Held out of the fit ({slo})",
            "",
            "| shape (words x max_tokens) | prompt tok | output tok | predicted knee | measured knee | error | "
            "knee for the measured tokens | levels | measured knee's bound |",
            "|---|---|---|---|---|---|---|---|---|",
        ]
        for h in outcome.holdouts:
            levels = ", ".join(str(lv.concurrency) for lv in h.stage.levels)
            tokens = "–" if h.prompt_tokens is None else f"{h.prompt_tokens:.0f}"
            out = "–" if h.output_tokens is None else f"{h.output_tokens:.0f}"
            lines.append(
                f"| {h.shape} | {tokens} | {out} | {_knee(h.predicted)} | {_knee(h.measured)} | {relative(h.error)} | "
                f"{_knee(h.predicted_for_measured_tokens)} | {levels} | {h.stage.knee.bound} |"
            )
        errors = [abs(h.error) for h in outcome.holdouts if h.error is not None]
        within = sum(1 for e in errors if e <= GOAL)
        lines += [
            "",
            f"Error = (predicted − measured) / measured; the prediction was made before the measurement, from "
            f"the shape's words + the template's tokens, for the closed loop that measured it. {within} of "
            f"{len(outcome.holdouts)} held-out knees within "
            f"±{GOAL:.0%}" + (f"; largest |error| {max(errors):.0%}." if errors else "."),
        ]
    return lines


def compute_summary(outcome: ComputeOutcome | None, error: str | None) -> list[str]:
    if outcome is None:
        return [f"  compute model: the fit failed: {error}"] if error else []
    p = outcome.fit.params
    lines = [
        f"  compute model: c {p.request_overhead_s:.3g} s, a {p.step_s:.3g} s, b {p.per_sequence_s:.3g} s/seq, "
        f"g {p.per_prefill_token_s:.3g} s/token, tails e2e {p.tail_e2e:.3g} ttft {p.tail_ttft:.3g} "
        f"(RMS relative error {outcome.fit.rms_relative_error:.1%})"
    ]
    for h in outcome.holdouts:
        lines.append(
            f"    held out {h.shape}: predicted knee {_knee(h.predicted)}, measured {_knee(h.measured)} "
            f"({relative(h.error)})"
        )
    return lines
