"""Command line of bench: `python -m bench calibrate|overload ...` (and `spillover bench ...` once
`add_bench_parser` is registered on the spillover CLI's subparsers).

    calibrate --url http://127.0.0.1:8000/v1 --model NAME [--direct-url URL [--direct-model NAME]]
              [--concurrency 1,2,4,8] [--requests-per-level 20] [--warmup 2]
              [--prompt fixed:256] [--output fixed:64] [--prefix-share 0.5] [--prefix-count 4]
              [--slo-p95-s 5] [--slo-metric e2e|ttft] [--max-error-rate 0.01] [--keep-going]
              [--config configs/local.yaml] [--gpu-mem 80GiB] [--out DIR] [--overlay-out PATH]
              [--request-timeout-s 300] [--level-timeout-s 600] [--ignore-eos] [--api-key-env NAME]
              [--no-progress] [--seed 0]
              [--fit-shapes 600x8,50x32 [--fit-concurrency 1,2,4] [--fit-requests-per-level 4]
               [--holdout-shapes 150x48,450x24 [--holdout-requests-per-level N]] [--waves W]]

    overload  --url http://127.0.0.1:8000/v1 --model NAME --knee-rps MU [--multiples 0.5,1,1.5,2,3]
              [--duration-s 30] [--prompt fixed:200] [--output fixed:64] [--slo-p95-s 10]
              [--modes burst,local_only] [--deadline-ms MS|slo] [--drain-s S] [--cooldown-s 5]
              [--max-requests-per-level 2000] [--cloud-price-in 0.15] [--cloud-price-out 0.60]
              [--request-timeout-s 300] [--ignore-eos] [--api-key-env NAME] [--out DIR] [--seed 0]
              [--no-progress]

    faults    --url http://127.0.0.1:8000/v1 --model NAME --sim http://127.0.0.1:9100 [--sim URL ...]
              [--faults error_5xx,rate_limit,timeout,reset,midstream_cut,malformed] [--requests 12]
              [--streams 4] [--concurrency 4] [--hang-s 5] [--api-key-env NAME] [--out DIR] [--no-progress]

    overhead  --url http://127.0.0.1:8000 --model NAME [--rounds 30] [--warmup 3] [--config PATH]
              [--out DIR] [--seed 0] [--no-progress]      (on a node of the cluster: it joins Ray)

    affinity  --url http://127.0.0.1:8000/v1 [--models qwen-affinity,qwen-pow2] [--prefixes 8]
              [--prefix-words 600] [--requests 96] [--concurrency 2] [--out DIR] [--seed 0]
              (against `spillover serve --config configs/bench-affinity.yaml`)

    factual   [--url http://127.0.0.1:8000/v1] [--model smollm2-135m-instruct] [--concurrency 1,8]
              [--max-tokens 32] [--residency local_only|any] [--reference FILE | --reference-only]
              [--limit N] [--model-dir DIR] [--out DIR] [--api-key-env NAME] [--no-progress]

    soak      --url http://127.0.0.1:8000/v1 --model NAME [--duration-s 1800] [--concurrency N |
              --config PATH [--overlay PATH]] [--sample-s 30] [--window-s 300] [--stream-share 0.5]
              [--cloud-share 0.1] [--cloud-region local-sim] [--sim http://127.0.0.1:9100 [--faults ...]
              [--fault-rate 0.25] [--fault-every-s 150] [--fault-s 30] [--max-fault-episodes 20]]
              [--probe-every-s 60] [--out DIR] ...   (see bench/cli_trust.py)

Exit codes: 0 a knee was found and the overlay written (overload: the report written and something
answered; faults: nothing lost or re-sent; factual: the acceptance held; soak: every verdict passed),
1 no knee / nothing answered / a request lost / a URL unreachable / a verdict failed / other failure,
2 bad input (flags, config, a model the URL does not serve). Errors are one line, no traceback.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import Any

from bench.calibrate.fit import parse_shapes
from bench.calibrate.knee import DEFAULT_MAX_ERROR_RATE
from bench.calibrate.run import CalibrateOptions, calibrate, summary_lines
from bench.cli_args import number as _number
from bench.cli_args import run as _run
from bench.cli_gateway import (
    add_affinity_arguments,
    add_faults_arguments,
    add_overhead_arguments,
    cmd_affinity,
    cmd_faults,
    cmd_overhead,
)
from bench.cli_replay import add_replay_subcommand
from bench.cli_trust import add_trust_subcommands
from bench.load.workload import WorkloadError
from bench.overload.metrics import MODES
from bench.overload.run import DEFAULT_MULTIPLES, OverloadOptions, run_overload
from bench.overload.run import summary_lines as overload_summary_lines


def _levels(text: str) -> tuple[int, ...]:
    try:
        levels = tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a comma-separated list of whole numbers: {text!r}") from None
    if not levels or any(c < 1 for c in levels):
        raise argparse.ArgumentTypeError(f"concurrency levels must be >= 1: {text!r}")
    if list(levels) != sorted(set(levels)):
        raise argparse.ArgumentTypeError(f"concurrency levels must be increasing without repeats: {text!r}")
    return levels


def add_calibrate_arguments(parser: argparse.ArgumentParser) -> None:
    add = parser.add_argument
    add("--url", required=True, help="OpenAI-compatible base URL of the layer under test (the gateway), e.g. .../v1")
    add("--model", required=True, help="model name to request (and to look up in --config)")
    add("--direct-url", default=None, help="stage 1: base URL of the model itself (Ray's ingress, vLLM)")
    add("--direct-model", default=None, help="model name at --direct-url (default: --model)")
    add("--concurrency", type=_levels, default=(1, 2, 4, 8), help="levels, e.g. 1,2,4,8 (default)")
    add("--requests-per-level", type=_number(int, 1), default=20, help="measured requests per level (default 20)")
    add("--warmup", type=_number(int, 0), default=2, help="warm-up requests per level, not measured (default 2)")
    add("--prompt", default="fixed:256", help="prompt words: fixed:N, uniform:A-B, lognormal:MEAN[,SIGMA]")
    add("--output", default="fixed:64", help="max_tokens: fixed:N, uniform:A-B, lognormal:MEAN[,SIGMA]")
    add("--prefix-share", type=_number(float, 0, maximum=1), default=0.0, help="requests with a shared prefix")
    add("--prefix-count", type=_number(int, 1), default=4, help="distinct shared system prompts (default 4)")
    add("--slo-p95-s", type=_number(float, 0, exclusive=True), default=5.0, help="p95 latency SLO, s (default 5)")
    add("--slo-metric", choices=("e2e", "ttft"), default="e2e", help="latency the SLO applies to (default e2e)")
    add("--max-error-rate", type=_number(float, 0, maximum=0.99), default=DEFAULT_MAX_ERROR_RATE,
        help=f"error rate a level may have (default {DEFAULT_MAX_ERROR_RATE:g})")  # fmt: skip
    add("--keep-going", action="store_true", help="run every level even after one breaks the SLO or error limit")
    add("--config", default=None, help="deployment config for the formula prediction (default configs/local.yaml)")
    add("--gpu-mem", default=None, help="GPU memory per GPU for GPU models, e.g. 80GiB (default: NVML)")
    add("--out", default=None, help="report directory (default bench/results/calibrate-<model>-<time>)")
    add("--overlay-out", default=None, help="where to write the config overlay (default <out>/overlay.yaml)")
    add("--request-timeout-s", type=_number(float, 0, exclusive=True), default=300.0, help="per request (300)")
    add("--level-timeout-s", type=_number(float, 0, exclusive=True), default=600.0, help="per level (600)")
    add("--ignore-eos", action="store_true", help="send vLLM's ignore_eos so outputs run to max_tokens")
    add("--api-key-env", default=None, metavar="NAME", help="send the key held in env var NAME as a bearer token")
    add("--no-progress", action="store_true", help="no progress line on stderr")
    add("--seed", type=int, default=0, help="workload seed (default 0)")
    add("--fit-shapes", type=_shapes, default=None, metavar="PxO[,...]",
        help="fit the compute model: extra workloads (prompt words x max_tokens), e.g. 600x8,50x32")  # fmt: skip
    add("--fit-concurrency", type=_levels, default=(1, 2, 4), help="levels of each fit shape (default 1,2,4)")
    add("--fit-requests-per-level", type=_number(int, 1), default=4, help="per fit level (default 4)")
    add("--holdout-shapes", type=_shapes, default=None, metavar="PxO[,...]",
        help="held out of the fit: predict each knee, then measure it (e.g. 150x48,450x24)")  # fmt: skip
    add("--holdout-requests-per-level", type=_number(int, 1), default=None,
        help="per held-out level (default 8; with --waves, at least waves x N)")  # fmt: skip
    add("--waves", type=_number(int, 0), default=None,
        help="every level runs at least W x N requests (W rounds of N); default 0, held-out levels 4")  # fmt: skip


def _shapes(text: str) -> str:
    try:
        return ",".join(parse_shapes(text))
    except WorkloadError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def options_from_args(args: argparse.Namespace) -> CalibrateOptions:
    return CalibrateOptions(
        url=args.url,
        model=args.model,
        direct_url=args.direct_url,
        direct_model=args.direct_model,
        concurrency=args.concurrency,
        requests_per_level=args.requests_per_level,
        warmup=args.warmup,
        prompt=args.prompt,
        output=args.output,
        prefix_share=args.prefix_share,
        prefix_count=args.prefix_count,
        slo_p95_s=args.slo_p95_s,
        slo_metric=args.slo_metric,
        max_error_rate=args.max_error_rate,
        config_path=args.config,
        gpu_mem=args.gpu_mem,
        out_dir=args.out,
        overlay_out=args.overlay_out,
        seed=args.seed,
        progress=not args.no_progress,
        request_timeout_s=args.request_timeout_s,
        level_time_limit_s=args.level_timeout_s,
        keep_going=args.keep_going,
        ignore_eos=args.ignore_eos,
        api_key_env=args.api_key_env,
        fit_shapes=args.fit_shapes,
        fit_concurrency=args.fit_concurrency,
        fit_requests_per_level=args.fit_requests_per_level,
        holdout_shapes=args.holdout_shapes,
        holdout_requests_per_level=args.holdout_requests_per_level,
        waves=args.waves,
    )


def cmd_calibrate(args: argparse.Namespace) -> int:
    """Handler of `calibrate`: runs it, prints the summary; errors are one line on stderr."""
    if args.config is None:
        from cluster.config.deployment import default_config_path

        args.config = default_config_path()
    return _run(lambda: calibrate(options_from_args(args)), summary_lines)


def _multiples(text: str) -> tuple[float, ...]:
    try:
        values = tuple(float(part) for part in text.split(",") if part.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a comma-separated list of numbers: {text!r}") from None
    if not values or any(not v > 0 or v == float("inf") for v in values):
        raise argparse.ArgumentTypeError(f"multiples must be finite numbers > 0: {text!r}")
    if len(set(values)) != len(values):
        raise argparse.ArgumentTypeError(f"multiples must not repeat: {text!r}")
    return values


def _modes(text: str) -> tuple[str, ...]:
    modes = tuple(part.strip() for part in text.split(",") if part.strip())
    if not modes or any(m not in MODES for m in modes) or len(set(modes)) != len(modes):
        raise argparse.ArgumentTypeError(f"modes are some of {','.join(MODES)} without repeats: {text!r}")
    return modes


def _deadline(text: str) -> int | str:
    if text.strip().lower() == "slo":
        return "slo"
    return _number(int, 1)(text)


def add_overload_arguments(parser: argparse.ArgumentParser) -> None:
    add = parser.add_argument
    add("--url", required=True, help="OpenAI-compatible base URL of the gateway, e.g. http://127.0.0.1:8000/v1")
    add("--model", required=True, help="model name to request")
    add("--knee-rps", type=_number(float, 0, exclusive=True), required=True, metavar="MU",
        help="local capacity μ in req/s (the knee's throughput from `calibrate`)")  # fmt: skip
    add("--multiples", type=_multiples, default=DEFAULT_MULTIPLES,
        help="offered loads λ as multiples of μ (default 0.5,1,1.5,2,3)")  # fmt: skip
    add("--duration-s", type=_number(float, 0, exclusive=True), default=30.0, help="arrivals per level, s (30)")
    add("--prompt", default="fixed:200", help="prompt words: fixed:N, uniform:A-B, lognormal:MEAN[,SIGMA]")
    add("--output", default="fixed:64", help="max_tokens: fixed:N, uniform:A-B, lognormal:MEAN[,SIGMA]")
    add("--slo-p95-s", type=_number(float, 0, exclusive=True), default=10.0, help="e2e SLO per request, s (10)")
    add("--modes", type=_modes, default=MODES, help="burst, local_only or both (default burst,local_only)")
    add("--deadline-ms", type=_deadline, default=None, metavar="MS|slo",
        help="x-spillover-deadline-ms on local_only requests; `slo` = the SLO (default: none)")  # fmt: skip
    add("--drain-s", type=_number(float, 0), default=None, help="after the arrivals, s (default 2 × the SLO)")
    add("--cooldown-s", type=_number(float, 0), default=5.0, help="quiet between levels, s (default 5)")
    add("--max-requests-per-level", type=_number(int, 1), default=2000, help="arrivals per level at most (2000)")
    add("--cloud-price-in", type=_number(float, 0), default=0.15, help="USD per 1M input tokens (0.15)")
    add("--cloud-price-out", type=_number(float, 0), default=0.60, help="USD per 1M output tokens (0.60)")
    add("--request-timeout-s", type=_number(float, 0, exclusive=True), default=300.0, help="per request (300)")
    add("--ignore-eos", action="store_true", help="send vLLM's ignore_eos so outputs run to max_tokens")
    add("--api-key-env", default=None, metavar="NAME", help="send the key held in env var NAME as a bearer token")
    add("--out", default=None, help="report directory (default bench/results/overload-<model>-<time>)")
    add("--seed", type=int, default=0, help="workload and arrivals seed (default 0)")
    add("--no-progress", action="store_true", help="no progress line on stderr")


def overload_options_from_args(args: argparse.Namespace) -> OverloadOptions:
    deadline = round(args.slo_p95_s * 1000) if args.deadline_ms == "slo" else args.deadline_ms
    return OverloadOptions(
        url=args.url,
        model=args.model,
        knee_rps=args.knee_rps,
        multiples=args.multiples,
        duration_s=args.duration_s,
        prompt=args.prompt,
        output=args.output,
        slo_p95_s=args.slo_p95_s,
        modes=args.modes,
        deadline_ms=deadline,
        drain_s=args.drain_s,
        cooldown_s=args.cooldown_s,
        max_requests=args.max_requests_per_level,
        price_in=args.cloud_price_in,
        price_out=args.cloud_price_out,
        out_dir=args.out,
        seed=args.seed,
        progress=not args.no_progress,
        request_timeout_s=args.request_timeout_s,
        ignore_eos=args.ignore_eos,
        api_key_env=args.api_key_env,
    )


def cmd_overload(args: argparse.Namespace) -> int:
    """Handler of `overload`: runs it, prints the summary; errors are one line on stderr."""
    return _run(lambda: run_overload(overload_options_from_args(args)), overload_summary_lines)


def add_bench_subcommands(subparsers: Any) -> None:
    """Add the bench subcommands to a subparsers object (of `python -m bench` or of `spillover bench`)."""
    calibrate_parser = subparsers.add_parser(
        "calibrate",
        help="load-test a model and the gateway, find the knee, compare with the formula, write an overlay",
        description="Sweep concurrency levels, find the knee per stage, compare with the capacity formula, "
        "and write a report and an admission_limit config overlay.",
    )
    add_calibrate_arguments(calibrate_parser)
    calibrate_parser.set_defaults(func=cmd_calibrate)
    overload_parser = subparsers.add_parser(
        "overload",
        help="offer open-loop load at multiples of the knee, with bursting on and off; SLO attainment, cloud share",
        description="Offer Poisson load at multiples of the measured knee through the gateway, once with bursting "
        "(plain requests) and once local_only, and write a report with p95, SLO attainment, cloud share against "
        "the minimal share max(0, (λ − μ)/λ) and cloud cost.",
    )
    add_overload_arguments(overload_parser)
    overload_parser.set_defaults(func=cmd_overload)
    faults_parser = subparsers.add_parser(
        "faults",
        help="the fault matrix: one cloud-sim fault at a time; lost requests, re-sent streams, clean errors",
        description="Inject each cloud-sim fault into every request of the first --sim and count what the "
        "gateway's clients saw: lost non-streamed requests, streams that ended cleanly or were re-sent.",
    )
    add_faults_arguments(faults_parser)
    faults_parser.set_defaults(func=cmd_faults)
    overhead_parser = subparsers.add_parser(
        "overhead",
        help="the same tiny requests direct to a replica, through Ray's OpenAiIngress and through the gateway",
        description="Interleave tiny requests along three paths to the same model replica (a DeploymentHandle, "
        "Ray's OpenAiIngress deployed for the run at /ray, spillover's gateway) and report medians and ratios.",
    )
    add_overhead_arguments(overhead_parser)
    overhead_parser.set_defaults(func=cmd_overhead)
    affinity_parser = subparsers.add_parser(
        "affinity",
        help="prefix-affinity replica choice vs Ray's power-of-two: prefix-cache hit rate and TTFT, side by side",
        description="Send the same shared-prefix workload to two aliases of one model that differ only in "
        "replica_router, interleaved, and report hit rate, TTFT p50/p95 and per-replica prefix counters.",
    )
    add_affinity_arguments(affinity_parser)
    affinity_parser.set_defaults(func=cmd_affinity)
    add_trust_subcommands(subparsers)
    add_replay_subcommand(subparsers)


def add_bench_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Register `bench` (`calibrate`, `overload`, `faults`, `overhead`, `affinity`, `factual`, `soak`) on the
    spillover CLI's subparsers; the handler is `args.func`."""
    parser = subparsers.add_parser(
        "bench", help="load tests: calibrate the formulas, measure overload, run the fault matrix, factual, soak"
    )
    add_bench_subcommands(parser.add_subparsers(dest="bench_command", required=True))
    return parser


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m bench", description="spillover load tests")
    add_bench_subcommands(parser.add_subparsers(dest="bench_command", required=True))
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m bench ...`; argparse exits 2 on bad flags."""
    args = build_parser().parse_args(argv)
    return int(args.func(args))
