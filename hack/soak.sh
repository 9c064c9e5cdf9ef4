#!/usr/bin/env bash
# The fault soak (make soak; not part of make test): SOAK_RUNS upgrades (default 3)
# of seeds SOAK_SEED, SOAK_SEED+1, ... (default: the clock), each on a fresh local
# cluster of the seed's shape under the seed's faults, judged by the independent
# checker of e2e/soak, with a self-check run (SOAK_SELF_CHECK=0 leaves it out),
# SOAK_PARALLEL clusters side by side (default 5). No run starts once
# SOAK_TIMEOUT (default 50m) has passed. The report is written to
# _output/soak: one JSON per run, summary.json; the summary's line is printed
# last, and the exit status is non-zero when a run is broken.
set -o errexit -o nounset -o pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
export ICHOR_SIM="$root/_output/bin/ichor-sim"
export ICHOR_PLUGIN="$root/_output/bin/kubectl-ichor"
export ICHOR_CLUSTER_BINS="$root/_output/cluster-bins"
export ICHOR_E2E_ARTIFACTS="$root/_output/soak/logs"
export SOAK_OUT="$root/_output/soak"
bound=${SOAK_TIMEOUT:-50m}
parallel=${SOAK_PARALLEL:-5}
export SOAK_TIMEOUT=$bound
rm -f "$SOAK_OUT"/seed-*.json "$SOAK_OUT"/self-check-*.json "$SOAK_OUT"/summary.*
mkdir -p "$ICHOR_E2E_ARTIFACTS"
# go test's own bound: the soak's, plus the longest run it may still start.
case $bound in
  *h) minutes=$(( ${bound%h} * 60 )) ;;
  *m) minutes=${bound%m} ;;
  *) echo "soak: SOAK_TIMEOUT=$bound: pass whole minutes or hours, e.g. 50m or 2h" >&2; exit 1 ;;
esac
if ! [[ $minutes =~ ^[0-9]+$ ]]; then
  echo "soak: SOAK_TIMEOUT=$bound: pass whole minutes or hours, e.g. 50m or 2h" >&2
  exit 1
fi
set +o errexit
go test -count=1 -tags 'e2e soak' -run '^TestSoak$' -timeout "$(( minutes + 25 ))m" -parallel "$parallel" -v ./e2e 2>&1 |
  tee "$SOAK_OUT/soak.log" | grep --line-buffered -E '^\s*(soak_test.go:[0-9]+: (seed|self-check|soak:|run )|--- |FAIL|ok )'
status=${PIPESTATUS[0]}
set -o errexit
if [ -f "$SOAK_OUT/summary.txt" ]; then
  echo "report: $SOAK_OUT (summary.json, one JSON per run, soak.log)"
  cat "$SOAK_OUT/summary.txt"
else
  echo "soak: no summary written (see $SOAK_OUT/soak.log)"
  exit 1
fi
exit "$status"
