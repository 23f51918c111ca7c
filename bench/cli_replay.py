"""`bench replay`: its flags and handler (bench/replay/run.py does the work).

replay --url http://127.0.0.1:8001/v1 --model NAME --trace FILE [--format mooncake|azure|burstgpt|csv]
       [--columns time=COL,input=COL,output=COL[,blocks=COL] [--time-unit s|ms|us|iso]]
       [--window-s S] [--window-at busiest|SECONDS] [--spread-s S] [--keep P] [--stretch F]
       [--input-scale F] [--output-scale F] [--max-input N] [--max-output N] [--context-window N]
       [--max-requests N] [--policies shipped,local,cloud] [--label NAME] [--cloud-region REGION]
       [--slo-s 10] [--send-deadline] [--drain-s S] [--cooldown-s 10] [--cloud-price-in 0.15]
       [--cloud-price-out 0.60] [--request-timeout-s 300] [--no-ignore-eos] [--api-key-env NAME]
       [--out DIR] [--seed 0] [--no-progress]
replay --merge DIR DIR... [--out DIR]
replay --bound-only --model NAME --trace FILE --perf-from PATH [scaling flags]
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from bench.cli_args import choices, number, run
from bench.replay.merge import merge_summary_lines, run_merge
from bench.replay.metrics import Prices
from bench.replay.policies import POLICIES
from bench.replay.run import ReplayError, ReplayOptions, bound_lines, bound_only, run_replay, summary_lines
from bench.replay.scaling import BUSIEST, Scaling
from bench.replay.traces import FORMATS, TIME_UNITS, ColumnMap


def _window_at(text: str) -> float | str:
    return BUSIEST if text.strip().lower() == BUSIEST else number(float, 0)(text)


def add_replay_arguments(parser: argparse.ArgumentParser) -> None:
    add = parser.add_argument
    add("--url", help="OpenAI-compatible base URL of the gateway, e.g. http://127.0.0.1:8001/v1")
    add("--model", help="model name to request")
    add("--trace", metavar="FILE", help="the arrival trace (Mooncake JSONL, Azure or BurstGPT CSV, CSV)")
    add("--format", choices=FORMATS, default=None, help="the trace's format (default: from the file)")
    add("--columns", default=None, metavar="time=COL,input=COL,output=COL[,blocks=COL]",
        help="the columns of a generic CSV trace (implies --format csv)")  # fmt: skip
    add("--time-unit", choices=tuple(TIME_UNITS), default="s", help="unit of a generic CSV's time column (s)")
    add("--window-s", type=number(float, 0, exclusive=True), default=None,
        help="replay this many seconds of the trace (default: all of it)")  # fmt: skip
    add("--window-at", type=_window_at, default=BUSIEST, metavar="busiest|SECONDS",
        help="where the window starts: the busiest window (default) or a second of the trace")  # fmt: skip
    add("--spread-s", type=number(float, 0), default=None,
        help="spread equal timestamps over this many seconds (default: 3 for mooncake, else 0)")  # fmt: skip
    add("--keep", type=number(float, 0, exclusive=True, maximum=1), default=1.0,
        help="keep this share of the requests, seeded (thinning; default 1)")  # fmt: skip
    add("--stretch", type=number(float, 0, exclusive=True), default=1.0,
        help="multiply arrival times by this (> 1 slower, < 1 faster; default 1)")  # fmt: skip
    add("--input-scale", type=number(float, 0, exclusive=True), default=1.0, help="prompt tokens × this (1)")
    add("--output-scale", type=number(float, 0, exclusive=True), default=1.0, help="output tokens × this (1)")
    add("--max-input", type=number(int, 1), default=None, help="cap on prompt tokens after scaling")
    add("--max-output", type=number(int, 1), default=None, help="cap on output tokens after scaling")
    add("--context-window", type=number(int, 2), default=4096, help="the model's window: prompt + output (4096)")
    add("--max-requests", type=number(int, 1), default=None, help="replay at most this many requests")
    add("--policies", type=choices(POLICIES, "policies"), default=("shipped",),
        help=f"some of {','.join(POLICIES)} (default shipped), each on the same arrivals")  # fmt: skip
    add("--label", default=None, help="the report's name for `shipped` (e.g. the gateway config it ran)")
    add("--cloud-region", default="local-sim", help="the region the `cloud` policy pins (default local-sim)")
    add("--slo-s", type=number(float, 0, exclusive=True), default=10.0, help="e2e SLO per request, s (10)")
    add("--send-deadline", action="store_true", help="send the SLO as x-spillover-deadline-ms on every request")
    add("--drain-s", type=number(float, 0), default=None, help="after the last arrival, s (default 2 × the SLO)")
    add("--cooldown-s", type=number(float, 0), default=10.0, help="quiet between policies, s (10)")
    add("--cloud-price-in", type=number(float, 0), default=0.15, help="USD per 1M input tokens (0.15)")
    add("--cloud-price-out", type=number(float, 0), default=0.60, help="USD per 1M output tokens (0.60)")
    add("--request-timeout-s", type=number(float, 0, exclusive=True), default=300.0, help="per request (300)")
    add(
        "--no-ignore-eos", action="store_true", help="let answers stop early (default: ignore_eos: the trace's lengths)"
    )
    add("--api-key-env", default=None, metavar="NAME", help="send the key held in env var NAME as a bearer token")
    add("--perf-from", default=None, metavar="PATH",
        help="a config or overlay with the fitted perf: adds the offline lower bound on the cloud share")  # fmt: skip
    add("--replicas", type=number(int, 1), default=1, help="local replicas, for the offline bound (1)")
    add("--out", default=None, help="report directory (default bench/results/replay-<time>)")
    add("--seed", type=int, default=0, help="spreading, thinning and prompt seed (default 0)")
    add("--no-progress", action="store_true", help="no progress lines on stderr")
    add("--bound-only", action="store_true",
        help="send nothing: print the offline bound and the clairvoyant schedule for --perf-from's fit")  # fmt: skip
    add("--merge", nargs="+", default=None, metavar="DIR",
        help="replay nothing: merge replays of the same arrivals (each a gateway config) into one report")  # fmt: skip


def replay_options_from_args(args: argparse.Namespace) -> ReplayOptions:
    columns = ColumnMap.parse(args.columns, args.time_unit) if args.columns else None
    fmt = "csv" if columns is not None and args.format is None else args.format
    if columns is not None and fmt != "csv":
        raise ReplayError("--columns goes with --format csv", 2)
    spread = args.spread_s
    if spread is None:
        spread = 3.0 if (fmt or ("mooncake" if str(args.trace).endswith(".jsonl") else "")) == "mooncake" else 0.0
    scaling = Scaling(
        spread_s=spread,
        window_s=args.window_s,
        window_at=args.window_at,
        keep=args.keep,
        stretch=args.stretch,
        input_scale=args.input_scale,
        output_scale=args.output_scale,
        max_input=args.max_input,
        max_output=args.max_output,
        context_window=args.context_window,
        max_requests=args.max_requests,
        seed=args.seed,
    )
    return ReplayOptions(
        url=args.url,
        model=args.model,
        trace=args.trace,
        format=fmt,
        columns=columns,
        scaling=scaling,
        policies=args.policies,
        label=args.label,
        slo_s=args.slo_s,
        send_deadline=args.send_deadline,
        cloud_region=args.cloud_region,
        prices=Prices(args.cloud_price_in, args.cloud_price_out),
        drain_s=args.drain_s,
        cooldown_s=args.cooldown_s,
        request_timeout_s=args.request_timeout_s,
        ignore_eos=not args.no_ignore_eos,
        out_dir=args.out,
        progress=not args.no_progress,
        api_key_env=args.api_key_env,
        perf_from=args.perf_from,
        replicas=args.replicas,
    )


def cmd_replay(args: argparse.Namespace) -> int:
    """Handler of `replay`: runs it (or merges earlier runs), prints the summary; errors (bad flags or trace
    included) are one line."""
    if args.merge is not None:
        return run(lambda: run_merge(args.merge, args.out), merge_summary_lines)
    if args.bound_only:
        if args.model is None or args.trace is None:
            print("error: --bound-only needs --model and --trace", file=sys.stderr, flush=True)
            return 2
        args.url = args.url or "http://127.0.0.1:8001/v1"  # nothing is sent
        return run(lambda: bound_only(replay_options_from_args(args)), bound_lines)
    missing = [flag for flag in ("url", "model", "trace") if getattr(args, flag) is None]
    if missing:
        print(f"error: bench replay needs --{', --'.join(missing)} (or --merge DIR...)", file=sys.stderr, flush=True)
        return 2
    return run(lambda: run_replay(replay_options_from_args(args)), summary_lines)


def add_replay_subcommand(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "replay",
        help="replay a production arrival trace open-loop per policy: SLO attainment against cloud spend",
        description="Replay a real arrival trace (Mooncake, Azure, BurstGPT or a CSV), scaled to this box with "
        "documented, seeded steps, open-loop through the gateway once per policy on the same arrivals; report per "
        "request (route, target, TTFT, e2e, tokens, cost, SLO met) and SLO attainment against cloud spend.",
    )
    add_replay_arguments(parser)
    parser.set_defaults(func=cmd_replay)
