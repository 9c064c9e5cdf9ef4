#!/usr/bin/env bash
# Benchmarks against local simulated clusters; for now the plan benchmark:
# a cluster of each size in BENCH_SIZES (nodes, 3 of them control planes;
# default 5 and 1000), BENCH_RUNS measured plans each (default 5). Writes
# _output/bench/plan.json and plan.txt. Never fails on a timing: only when a
# cluster does not start or the plugin gives no plan.
set -o errexit -o nounset -o pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
out=$root/_output/bench
mkdir -p "$out"
go build -o "$out/bench" ./e2e/bench
"$out/bench" \
  --sizes "${BENCH_SIZES:-5,1000}" \
  --runs "${BENCH_RUNS:-5}" \
  --out "$out" \
  --sim "${ICHOR_SIM:-$root/_output/bin/ichor-sim}" \
  --plugin "${ICHOR_PLUGIN:-$root/_output/bin/kubectl-ichor}" \
  --bin-dir "${ICHOR_CLUSTER_BINS:-$root/_output/cluster-bins}" \
  plan
