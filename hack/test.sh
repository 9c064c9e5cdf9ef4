#!/usr/bin/env bash
# Unit tests (no cluster), then the local-cluster tests, which start their own
# simulated clusters with _output/bin/ichor-sim. With "e2e" only the latter.
set -o errexit -o nounset -o pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
export ICHOR_SIM="$root/_output/bin/ichor-sim"
export ICHOR_PLUGIN="$root/_output/bin/kubectl-ichor"
export ICHOR_CLUSTER_BINS="$root/_output/cluster-bins"
export ICHOR_E2E_ARTIFACTS="$root/_output/e2e"
mkdir -p "$ICHOR_E2E_ARTIFACTS"
if [ "${1:-}" != "e2e" ]; then
  echo "test: unit tests"
  go test -count=1 ./...
fi
# The local-cluster tests mostly wait on simulated latencies (an idle cluster
# costs a few percent of a core): three at a time keep two cores busy.
parallel=${E2E_PARALLEL:-3}
echo "test: local-cluster tests, $parallel at a time (logs of each cluster kept under _output/e2e)"
go test -count=1 -tags e2e -timeout 40m -parallel "$parallel" ./e2e
