#!/usr/bin/env bash
# Benchmarks against local simulated clusters, written to _output/bench:
# - plan: a cluster of each size in BENCH_SIZES (nodes, 3 of them control
#   planes; default 5 and 1000), BENCH_RUNS measured plans each (default 5):
#   plan.json and plan.txt;
# - upgrade: a Kubernetes upgrade through the Job of a cluster of each size in
#   BENCH_UPGRADE_SIZES (default 8 and 23), BENCH_MAX_UNAVAILABLE workers at
#   once (default 5), with fixed simulated latencies: wall time against the
#   critical path's lower bound, the gaps between nodes, requests per node and
#   the runner's memory and CPU: upgrade.json and upgrade.txt.
# BENCH selects the benchmarks (default "plan upgrade"). Never fails on a
# timing: only when a cluster does not start, the plugin gives no plan or the
# upgrade does not succeed.
set -o errexit -o nounset -o pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
out=$root/_output/bench
mkdir -p "$out"
go build -o "$out/bench" ./e2e/bench
# shellcheck disable=SC2086 # BENCH is a list of words
"$out/bench" \
  --sizes "${BENCH_SIZES:-5,1000}" \
  --runs "${BENCH_RUNS:-5}" \
  --upgrade-sizes "${BENCH_UPGRADE_SIZES:-8,23}" \
  --max-unavailable "${BENCH_MAX_UNAVAILABLE:-5}" \
  --out "$out" \
  --sim "${ICHOR_SIM:-$root/_output/bin/ichor-sim}" \
  --plugin "${ICHOR_PLUGIN:-$root/_output/bin/kubectl-ichor}" \
  --bin-dir "${ICHOR_CLUSTER_BINS:-$root/_output/cluster-bins}" \
  --image-root "${ICHOR_IMAGE_ROOT:-$root/_output/image/rootfs}" \
  ${BENCH:-plan upgrade}
