"""`bench factual` and `bench soak`: the commands that ask whether the stack can be trusted — right answers
wherever the float32 reference is right, and hours of mixed load without growth, loss or wrong answers.
Registered by `bench.cli`."""

from __future__ import annotations

import argparse
from typing import Any

from bench.cli_args import choices
from bench.cli_args import levels as _levels
from bench.cli_args import number as _number
from bench.cli_args import run as _run
from bench.factual.run import DEFAULT_MODEL, FactualOptions, FactualOutcome, run_factual
from bench.factual.run import summary_lines as factual_summary
from bench.load.target import BenchError, api_key_from_env
from bench.soak.load import DEFAULT_FAULTS, FAULT_NAMES, FaultPlan, TrafficMix
from bench.soak.report import summary_lines as soak_summary
from bench.soak.run import SoakError, SoakOptions, SoakOutcome, run_soak


def add_factual_arguments(parser: argparse.ArgumentParser) -> None:
    add = parser.add_argument
    add("--url", default=None, help="OpenAI-compatible base URL of the gateway, e.g. http://127.0.0.1:8000/v1")
    add("--model", default=DEFAULT_MODEL, help=f"model to request and whose folder is the reference ({DEFAULT_MODEL})")
    add("--model-dir", default=None, help="the model folder for the reference (default: the prepared catalog one)")
    add("--concurrency", type=_levels, default=(1, 8), help="one served pass per level (1,8)")
    add("--max-tokens", type=_number(int, 1), default=32, help="max_tokens / max_new_tokens (32)")
    add(
        "--residency",
        default="local_only",
        help="x-spillover-residency of served requests (local_only: the local model answers); any: none sent",
    )
    add("--reference", default=None, metavar="FILE", help="reuse the reference.json of an earlier run")
    add("--reference-only", action="store_true", help="only compute the float32 reference (no --url)")
    add("--limit", type=_number(int, 1), default=None, metavar="N", help="only the first N prompts (a quick check)")
    add("--request-timeout-s", type=_number(float, 0, exclusive=True), default=120.0, help="per request (120)")
    add("--api-key-env", default=None, metavar="NAME", help="send the key held in env var NAME as a bearer token")
    add("--out", default=None, help="report directory (default bench/results/factual-<model>-<time>)")
    add("--no-progress", action="store_true", help="no progress lines on stderr")


def cmd_factual(args: argparse.Namespace) -> int:
    """Handler of `factual`: the reference, the served passes, the acceptance."""

    def command() -> FactualOutcome:
        opts = FactualOptions(
            url=args.url,
            model=args.model,
            model_dir=args.model_dir,
            concurrency=args.concurrency,
            max_tokens=args.max_tokens,
            residency=args.residency,
            reference=args.reference,
            reference_only=args.reference_only,
            limit=args.limit,
            request_timeout_s=args.request_timeout_s,
            api_key=api_key_from_env(args.api_key_env),
            out_dir=args.out,
            progress=not args.no_progress,
        )
        return run_factual(opts)

    return _run(command, factual_summary)


def add_soak_arguments(parser: argparse.ArgumentParser) -> None:
    add = parser.add_argument
    mix, plan = TrafficMix(), FaultPlan()
    add("--url", required=True, help="the gateway's OpenAI base URL on loopback, e.g. http://127.0.0.1:8000/v1")
    add("--model", required=True, help="model name to request")
    add("--duration-s", type=_number(float, 0, exclusive=True), default=1800.0, help="how long to load (1800)")
    add(
        "--concurrency",
        type=_number(int, 1),
        default=None,
        help="requests in flight (default: --config's models[].admission_limit × replicas: the calibrated knee)",
    )
    add("--config", default=None, help="deployment config for the default concurrency (default configs/local.yaml)")
    add(
        "--overlay",
        action="append",
        default=[],
        metavar="PATH",
        help="config overlay merged on top, e.g. the overlay.yaml `bench calibrate` wrote (repeatable)",
    )
    add("--sample-s", type=_number(float, 0, exclusive=True), default=30.0, help="process samples every (30)")
    add("--window-s", type=_number(float, 0, exclusive=True), default=300.0, help="latency windows (300)")
    add("--stream-share", type=_number(float, 0, maximum=1), default=mix.stream_share, help="streamed (0.5)")
    add(
        "--cloud-share",
        type=_number(float, 0, maximum=1),
        default=mix.cloud_share,
        help="pinned to --cloud-region, i.e. burst to the cloud simulator (0.1)",
    )
    add("--cloud-region", default=mix.cloud_region, help=f"the cloud simulator provider's region ({mix.cloud_region})")
    add("--prompt", default="uniform:20-200", help="prompt words: fixed:N, uniform:A-B, lognormal:MEAN[,SIGMA]")
    add("--output", default="uniform:8-64", help="max_tokens: fixed:N, uniform:A-B, lognormal:MEAN[,SIGMA]")
    add("--prefix-share", type=_number(float, 0, maximum=1), default=0.3, help="with a shared system prompt (0.3)")
    add(
        "--sim",
        default=None,
        metavar="URL",
        help="the cloud simulator the gateway uses (faults go there), e.g. http://127.0.0.1:9100; none: no faults",
    )
    add(
        "--faults",
        type=choices(FAULT_NAMES, "faults"),
        default=DEFAULT_FAULTS,
        help=f"in turn ({','.join(DEFAULT_FAULTS)})",
    )
    add(
        "--fault-rate",
        type=_number(float, 0, exclusive=True, maximum=1),
        default=plan.rate,
        help=f"share of the simulator's requests that get the fault during an episode ({plan.rate:g})",
    )
    add(
        "--fault-every-s",
        type=_number(float, 0, exclusive=True),
        default=plan.every_s,
        help=f"an episode starts every ({plan.every_s:g})",
    )
    add(
        "--fault-s",
        type=_number(float, 0, exclusive=True),
        default=plan.duration_s,
        help=f"an episode lasts ({plan.duration_s:g})",
    )
    add("--max-fault-episodes", type=_number(int, 0), default=plan.max_episodes, help=f"({plan.max_episodes})")
    add("--hang-s", type=_number(float, 0), default=plan.hang_s, help=f"the timeout fault's hang ({plan.hang_s:g})")
    add("--probe-every-s", type=_number(float, 0, exclusive=True), default=60.0, help="a probe every (60)")
    add("--probe-prompt", default=mix.probe_prompt, help=f"the probe's prompt ({mix.probe_prompt!r})")
    add("--drain-s", type=_number(float, 0), default=60.0, help="for requests in flight at the end (60)")
    add("--growth-limit", type=_number(float, 0), default=0.05, help="RSS / FD growth allowed after warm-up (0.05)")
    add("--p99-ratio", type=_number(float, 0, exclusive=True), default=1.5, help="last / second window p99 (1.5)")
    add(
        "--request-timeout-s",
        type=_number(float, 0, exclusive=True),
        default=mix.request_timeout_s,
        help=f"per request; past the gateway's request_timeout_s: its answer comes first ({mix.request_timeout_s:g})",
    )
    add("--api-key-env", default=None, metavar="NAME", help="send the key held in env var NAME as a bearer token")
    add("--seed", type=int, default=0, help="workload seed (default 0)")
    add("--out", default=None, help="report directory (default bench/results/soak-<model>-<time>)")
    add("--no-progress", action="store_true", help="no progress lines on stderr")


def default_concurrency(config_path: str | None, overlays: list[str], model: str) -> tuple[int, str]:
    """The config's admission limit for `model` × its replicas, and where it came from; exit 2 when none."""
    from cluster.config.deployment import default_config_path, load_config

    path = config_path or default_config_path()
    config = load_config(path, overlays)
    spec = next((m for m in config.models if m.alias == model), None)
    if spec is None:
        raise SoakError(f"{path} has no model {model!r}: give --concurrency", 2)
    if spec.admission_limit is None:
        raise SoakError(
            f"{path} sets no models[{model}].admission_limit (the calibrated knee): give --concurrency "
            "or --overlay the overlay.yaml of `bench calibrate`",
            2,
        )
    return spec.admission_limit * spec.replicas, (
        f"{path}: admission_limit {spec.admission_limit} × {spec.replicas} replica(s)"
    )


def cmd_soak(args: argparse.Namespace) -> int:
    """Handler of `soak`: the long mixed run and its report."""

    def command() -> SoakOutcome:
        from router.errors import ConfigError

        if args.concurrency is not None:
            concurrency, source = args.concurrency, "--concurrency"
        else:
            try:
                concurrency, source = default_concurrency(args.config, args.overlay, args.model)
            except ConfigError as exc:
                raise BenchError(exc.message, 2) from None
        opts = SoakOptions(
            url=args.url,
            model=args.model,
            concurrency=concurrency,
            concurrency_source=source,
            duration_s=args.duration_s,
            sample_s=args.sample_s,
            window_s=args.window_s,
            mix=TrafficMix(
                stream_share=args.stream_share,
                cloud_share=args.cloud_share,
                cloud_region=args.cloud_region,
                probe_prompt=args.probe_prompt,
                request_timeout_s=args.request_timeout_s,
            ),
            prompt=args.prompt,
            output=args.output,
            prefix_share=args.prefix_share,
            sim_url=args.sim,
            faults=FaultPlan(
                faults=args.faults,
                rate=args.fault_rate,
                every_s=args.fault_every_s,
                duration_s=args.fault_s,
                max_episodes=args.max_fault_episodes,
                hang_s=args.hang_s,
            ),
            probe_every_s=args.probe_every_s,
            drain_s=args.drain_s,
            growth_limit=args.growth_limit,
            p99_ratio=args.p99_ratio,
            api_key=api_key_from_env(args.api_key_env),
            seed=args.seed,
            out_dir=args.out,
            progress=not args.no_progress,
        )
        return run_soak(opts)

    return _run(command, soak_summary)


def add_trust_subcommands(subparsers: Any) -> None:
    """Add `factual` and `soak` to a subparsers object (of `python -m bench` or `spillover bench`)."""
    factual = subparsers.add_parser(
        "factual",
        help="200 factual prompts: the served model must be right wherever its float32 reference is",
        description="Run the factual set through transformers in float32 (the reference) and through the "
        "gateway at temperature 0 (one pass per concurrency level); every prompt the reference answers right "
        "must be answered right, and no answer may degenerate.",
    )
    add_factual_arguments(factual)
    factual.set_defaults(func=cmd_factual)
    soak = subparsers.add_parser(
        "soak",
        help="a long mixed run (default 30 min): RSS / FDs of every process, p99 per window, lost and wrong",
        description="Load the gateway for --duration-s with a mixed workload (streams and not, a share burst to "
        "the cloud simulator, faults injected there), sampling every process of the stack; verdicts: growth "
        "after warm-up, stable p99, nothing lost, no wrong answer.",
    )
    add_soak_arguments(soak)
    soak.set_defaults(func=cmd_soak)
