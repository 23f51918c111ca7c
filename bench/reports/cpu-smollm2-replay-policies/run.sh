#!/usr/bin/env bash
# Every policy of the burst-economics comparison on the same arrivals: one `spillover serve --cloud-sim` per
# gateway config (an overlay of this folder, or none: the default as shipped), the same `bench replay` flags and
# seed against each, then `bench replay --merge` into one report.
#   bench/reports/cpu-smollm2-replay-policies/run.sh [OUT]        (~35 minutes on 2 cores)
# Needs nothing else running on ports 8000, 8001, 9100 or a Ray of its own.
set -euo pipefail
cd "$(dirname "$0")/../../.."
here=bench/reports/cpu-smollm2-replay-policies
out=${1:-bench/results/replay-policies-$(date +%Y%m%d-%H%M%S)}
mkdir -p "$out"
replay=(
  --url http://127.0.0.1:8001/v1 --model smollm2-135m-instruct
  --trace bench/traces/mooncake-conversation-10min.jsonl --window-s 180 --keep 0.35
  --input-scale 0.02 --output-scale 0.05 --max-output 64 --slo-s 10 --drain-s 30 --seed 0
  --cloud-region local-sim --perf-from configs/local.yaml --no-progress
)

serve_pid=""
stop_stack() {  # SIGTERM: `spillover serve` stops Serve, its Ray and its cloud-sim (a background job ignores
  if [ -n "$serve_pid" ]; then  # SIGINT in a script), forced after 60 s
    kill -TERM "$serve_pid" 2> /dev/null || true
    for _ in $(seq 60); do kill -0 "$serve_pid" 2> /dev/null || break; sleep 1; done
    kill -KILL "$serve_pid" 2> /dev/null || true
    serve_pid=""
  fi
  pkill -f "bench.cloud_sim --port 9100" || true
  .venv/bin/ray stop --force > /dev/null 2>&1 || true
}

one() {  # label, overlay ("" for the default), policies
  local label=$1 overlay=$2 policies=$3
  echo "== $label: serve ${overlay:-(the default)}, replay $policies ($(date -u +%H:%M:%S))"
  .venv/bin/spillover serve --cloud-sim ${overlay:+--overlay "$overlay"} > "$out/serve-$label.log" 2>&1 &
  serve_pid=$!
  for _ in $(seq 600); do
    if curl -sf -o /dev/null http://127.0.0.1:8001/readyz; then break; fi
    sleep 1
  done
  curl -sf -o /dev/null http://127.0.0.1:8001/readyz || { echo "the stack for $label never became ready"; exit 1; }
  .venv/bin/spillover bench replay "${replay[@]}" --policies "$policies" --label "$label" --out "$out/$label"
  stop_stack
}

trap stop_stack EXIT
stop_stack
one watermarks "$here/overlay-watermarks.yaml" shipped,local,cloud
one limit "$here/overlay-limit.yaml" shipped
one proportional "$here/overlay-proportional.yaml" shipped
one deadline "$here/overlay-deadline.yaml" shipped
one default "" shipped
.venv/bin/spillover bench replay --merge "$out"/{watermarks,limit,proportional,deadline,default} --out "$out/merged"
