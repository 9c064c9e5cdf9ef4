#!/usr/bin/env bash
# make demo: start a local simulated Talos cluster (3 control planes, 2
# workers), show it, plan and run a Kubernetes upgrade against it, and tear
# it down.
set -o errexit -o nounset -o pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
bin=$root/_output/bin
dir=${ICHOR_DEMO_DIR:-$root/_output/demo}
from=${ICHOR_DEMO_FROM:-v1.36.3}
to=${ICHOR_DEMO_TO:-v1.37.2}

cleanup() { "$bin/ichor-sim" down --dir "$dir" >/dev/null 2>&1 || true; }
trap cleanup EXIT

step() { printf '\n\033[1m==> %s\033[0m\n' "$*"; }

step "Starting a local Talos cluster (3 control planes, 2 workers, Talos ${ICHOR_DEMO_TALOS:-v1.14.1}, Kubernetes $from)"
"$bin/ichor-sim" down --dir "$dir" >/dev/null 2>&1 || true
"$bin/ichor-sim" up --dir "$dir" --control-planes 3 --workers 2 --kubernetes "$from" --talos "${ICHOR_DEMO_TALOS:-v1.14.1}" \
  --image "ghcr.io/ichor-dev/kubectl-ichor=$root/_output/image/rootfs"
export KUBECONFIG=$dir/kubeconfig TALOSCONFIG=$dir/talosconfig
kubectl=$root/_output/cluster-bins/kubectl

step "kubectl get nodes"
"$kubectl" get nodes -o wide
step "The control plane's static pods"
"$kubectl" get pods -n kube-system -l tier=control-plane -o wide

step "kubectl ichor plan kubernetes --to $to"
PATH=$bin:$PATH kubectl-ichor plan kubernetes --to "$to"

step "kubectl ichor upgrade kubernetes --to $to --yes (an in-cluster Job runs it; its pod is a local process)"
PATH=$bin:$PATH kubectl-ichor upgrade kubernetes --to "$to" --yes

step "kubectl ichor status"
PATH=$bin:$PATH kubectl-ichor status

step "kubectl get nodes"
"$kubectl" get nodes -o wide

step "What started when (events.jsonl, recorded by the simulator): the order of the stages"
grep -v '"version":"'"$from"'"' "$dir/events.jsonl" | grep -v '"component":"talos"' |
  sed -E 's/.*"time":"[0-9-]+T([0-9:.]{12})[0-9]*Z","node":"([^"]+)","component":"([^"]+)","version":"([^"]+)".*/  \1  \2  \3 \4/'

step "Done: the cluster is being torn down (keep one with: _output/bin/ichor-sim up --dir /tmp/c)"
