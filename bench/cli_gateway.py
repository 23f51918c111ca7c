"""`bench faults`, `bench overhead` and `bench affinity`: the commands that test the gateway layer
(resilience, ingress cost, replica choice) rather than the model. Registered by `bench.cli`."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from bench.cli_args import choices
from bench.cli_args import levels as _levels
from bench.cli_args import number as _number
from bench.cli_args import run as _run
from bench.gateway.affinity import AffinityOptions, run_affinity_command
from bench.gateway.affinity import summary_lines as affinity_summary
from bench.gateway.faults import FAULTS, FaultOptions, FaultRun, run_faults
from bench.gateway.faults import summary_lines as faults_summary_lines
from bench.gateway.overhead import OverheadOptions, run_overhead
from bench.gateway.overhead import summary_lines as overhead_summary
from bench.gateway.overhead_streams import DEFAULT_LEVELS, StreamOptions
from bench.gateway.throughput import DEFAULT_LEVELS as THROUGHPUT_LEVELS
from bench.gateway.throughput import ThroughputOptions
from bench.load.target import BenchError, api_key_from_env


def add_faults_arguments(parser: argparse.ArgumentParser) -> None:
    add = parser.add_argument
    add("--url", required=True, help="OpenAI-compatible base URL of the gateway, e.g. http://127.0.0.1:8000/v1")
    add("--model", required=True, help="model name to request (tool requests: they go to the cloud targets)")
    add("--sim", action="append", required=True, metavar="URL",
        help="a cloud-sim the gateway uses; the first gets the faults and must rank first (repeatable)")  # fmt: skip
    add("--faults", type=choices(FAULTS, "faults"), default=FAULTS, help=f"which faults (default {','.join(FAULTS)})")
    add("--requests", type=_number(int, 0), default=12, help="non-streamed requests per fault (12)")
    add("--streams", type=_number(int, 0), default=4, help="streamed requests per fault (4)")
    add("--concurrency", type=_number(int, 1), default=4, help="requests in flight (4)")
    add("--hang-s", type=_number(float, 0, exclusive=True), default=5.0,
        help="the timeout fault's hang; longer than the provider's timeout_s (5)")  # fmt: skip
    add("--request-timeout-s", type=_number(float, 0, exclusive=True), default=60.0, help="per request (60)")
    add("--api-key-env", default=None, metavar="NAME", help="send the key held in env var NAME as a bearer token")
    add("--out", default=None, help="report directory (default bench/results/faults-<time>)")
    add("--no-progress", action="store_true", help="no progress lines on stderr")


def cmd_faults(args: argparse.Namespace) -> int:
    """Handler of `faults`: runs the matrix, prints the table; errors are one line on stderr."""
    out = Path(args.out) if args.out else Path("bench/results") / f"faults-{time.strftime('%Y%m%d-%H%M%S')}"

    def command() -> FaultRun:
        opts = FaultOptions(
            url=args.url.rstrip("/"),
            sims=tuple(args.sim),
            model=args.model,
            faults=args.faults,
            requests=args.requests,
            streams=args.streams,
            concurrency=args.concurrency,
            hang_s=args.hang_s,
            request_timeout_s=args.request_timeout_s,
            api_key=api_key_from_env(args.api_key_env),
        )
        return run_faults(opts, out, progress=not args.no_progress)

    return _run(command, faults_summary_lines)


def add_overhead_arguments(parser: argparse.ArgumentParser) -> None:
    add = parser.add_argument
    add("--url", default="http://127.0.0.1:8000", help="the Serve HTTP proxy (gateway at /v1); default :8000")
    add("--model", required=True, help="model alias to call on every path")
    add("--rounds", type=_number(int, 1), default=30, help="measured rounds, one request per path each (30)")
    add("--warmup", type=_number(int, 0), default=3, help="warm-up rounds, not measured (3)")
    add("--config", default=None, help="the running deployment's config (default configs/local.yaml)")
    add("--request-timeout-s", type=_number(float, 0, exclusive=True), default=60.0, help="per request (60)")
    add("--out", default=None, help="report directory (default bench/results/overhead-<time>)")
    add("--seed", type=int, default=0, help="order of the paths in each round (default 0)")
    add("--vllm-url", default=None, metavar="URL",
        help="a plain vLLM OpenAI server of the same model and dtype (…/v1): adds the vllm path")  # fmt: skip
    add("--http-region", default=None, metavar="REGION",
        help="region of the gateway's provider whose base_url is --vllm-url: adds the gateway-http path")  # fmt: skip
    add("--litellm-url", default=None, metavar="URL", help="a LiteLLM proxy in front of --vllm-url (…/v1)")
    add("--gateway-direct-url", default=None, metavar="URL",
        help="the gateway replica's own listener (gateway.direct_port), e.g. http://127.0.0.1:8001: adds the "
        "gateway-direct paths, without Serve's proxy")  # fmt: skip
    add("--no-ray-paths", action="store_true",
        help="HTTP paths only: skip direct and ray (no joining the Ray cluster)")  # fmt: skip
    add("--streams", action="store_true", help="also measure streams: TTFT, TPOT, output tok/s per path")
    add("--levels", type=_levels, default=DEFAULT_LEVELS, help="stream concurrency levels (1,4,16)")
    add("--stream-rounds", type=_number(int, 1), default=3, help="measured stream rounds per level (3)")
    add("--prompt-words", type=_number(int, 1), default=220, help="stream prompt length in words (220)")
    add("--output-tokens", type=_number(int, 2), default=64, help="stream answer length in tokens (64)")
    add("--throughput", action="store_true",
        help="also a gateway replica's req/s vs a zero-latency cloud-sim (needs --sim-url, --sim-region)")  # fmt: skip
    add("--sim-url", default=None, metavar="URL", help="the zero-latency cloud-sim (…/v1) for --throughput")
    add(
        "--sim-region",
        default=None,
        metavar="REGION",
        help="region of the gateway's provider whose base_url is --sim-url",
    )
    add("--throughput-levels", type=_levels, default=THROUGHPUT_LEVELS, help="closed-loop concurrencies (1,8,32)")
    add("--throughput-s", type=_number(float, 0, exclusive=True), default=10.0, help="seconds per path and level (10)")
    add("--no-progress", action="store_true", help="no progress lines on stderr")


def cmd_overhead(args: argparse.Namespace) -> int:
    """Handler of `overhead`: deploys Ray's ingress for the run, measures, prints the medians."""
    if args.config is None:
        from cluster.config.deployment import default_config_path

        args.config = default_config_path()
    out = Path(args.out) if args.out else Path("bench/results") / f"overhead-{time.strftime('%Y%m%d-%H%M%S')}"
    try:
        throughput = _throughput(args)
    except BenchError as exc:
        print(f"error: {exc.message}", file=sys.stderr, flush=True)
        return exc.exit_code
    opts = OverheadOptions(
        base_url=args.url.rstrip("/").removesuffix("/v1"),
        model=args.model,
        rounds=args.rounds,
        warmup=args.warmup,
        seed=args.seed,
        request_timeout_s=args.request_timeout_s,
        vllm_url=args.vllm_url,
        http_region=args.http_region,
        litellm_url=args.litellm_url,
        gateway_direct_url=_v1(args.gateway_direct_url),
        ray_paths=not args.no_ray_paths,
        streams=StreamOptions(
            {},
            args.model,
            levels=args.levels,
            rounds=args.stream_rounds,
            prompt_words=args.prompt_words,
            output_tokens=args.output_tokens,
            seed=args.seed,
        )
        if args.streams
        else None,
        throughput=throughput,
    )
    return _run(lambda: run_overhead(opts, str(args.config), out, progress=not args.no_progress), overhead_summary)


def _throughput(args: argparse.Namespace) -> ThroughputOptions | None:
    if not args.throughput:
        return None
    if not args.sim_url or not args.sim_region:
        raise BenchError("--throughput needs --sim-url and --sim-region", exit_code=2)
    return ThroughputOptions(
        gateway_url=_v1(args.url) or "",
        sim_url=args.sim_url,
        sim_region=args.sim_region,
        model=args.model,
        direct_url=_v1(args.gateway_direct_url),
        levels=args.throughput_levels,
        duration_s=args.throughput_s,
        request_timeout_s=args.request_timeout_s,
        seed=args.seed,
    )


def _v1(url: str | None) -> str | None:
    """An OpenAI-compatible base URL ending in /v1, given with or without it."""
    return None if not url else url.rstrip("/").removesuffix("/v1") + "/v1"


def _names(text: str) -> tuple[str, ...]:
    names = tuple(part.strip() for part in text.split(",") if part.strip())
    if len(names) < 2 or len(set(names)) != len(names):
        raise argparse.ArgumentTypeError(f"two or more distinct model names: {text!r}")
    return names


def add_affinity_arguments(parser: argparse.ArgumentParser) -> None:
    add = parser.add_argument
    add("--url", required=True, help="OpenAI-compatible base URL of the gateway, e.g. http://127.0.0.1:8000/v1")
    add("--models", type=_names, default=("qwen-affinity", "qwen-pow2"), help="aliases to compare (default: "
        "qwen-affinity,qwen-pow2 of configs/bench-affinity.yaml)")  # fmt: skip
    add("--prefixes", type=_number(int, 1), default=8, help="distinct system prompts (8)")
    add("--prefix-words", type=_number(int, 1), default=600, help="words per system prompt (600)")
    add("--requests", type=_number(int, 1), default=96, help="requests per model (96)")
    add("--concurrency", type=_number(int, 1), default=2, help="requests in flight (2)")
    add("--request-timeout-s", type=_number(float, 0, exclusive=True), default=120.0, help="per request (120)")
    add("--out", default=None, help="report directory (default bench/results/affinity-<time>)")
    add("--seed", type=int, default=0, help="workload seed (default 0)")
    add("--no-progress", action="store_true", help="no progress lines on stderr")


def cmd_affinity(args: argparse.Namespace) -> int:
    """Handler of `affinity`: the same shared-prefix load on two routers, side by side."""
    out = Path(args.out) if args.out else Path("bench/results") / f"affinity-{time.strftime('%Y%m%d-%H%M%S')}"
    opts = AffinityOptions(
        url=args.url.rstrip("/"),
        models=args.models,
        prefixes=args.prefixes,
        prefix_words=args.prefix_words,
        requests=args.requests,
        concurrency=args.concurrency,
        seed=args.seed,
        request_timeout_s=args.request_timeout_s,
    )
    return _run(lambda: run_affinity_command(opts, out, progress=not args.no_progress), affinity_summary)
