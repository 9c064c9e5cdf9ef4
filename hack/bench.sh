#!/usr/bin/env bash
# Benchmarks against local simulated clusters, written to _output/bench:
# - plan: a cluster of each size in BENCH_SIZES (nodes, 3 of them control
#   planes; default 5, 1000 and 5000), BENCH_RUNS measured plans each
#   (default 5): plan.json and plan.txt;
# - upgrade: a Kubernetes upgrade through the Job of a cluster of each size in
#   BENCH_UPGRADE_SIZES (default 8, 23 and 103, "103:10": a size's own
#   --max-unavailable after a colon), BENCH_MAX_UNAVAILABLE workers at once
#   otherwise (default 5), with fixed simulated latencies: wall time against the
#   critical path's lower bound, the gaps between nodes, requests per node and
#   the runner's memory and CPU; beside it, each on an identical cluster,
#   kubectl-ichor one worker at a time and talosctl upgrade-k8s, their walls
#   and ratios (BENCH_COMPARE=0 leaves them out): upgrade.json, upgrade.txt
#   and a timeline of each run, timeline-*.svg;
# - talos: a Talos OS upgrade (v1.13.9 -> v1.14.1) through the Job of a
#   cluster of each size in BENCH_TALOS_SIZES (default 23, "103:10" as
#   above), with the same latencies, measured and reported alike against its
#   own lower bound: talos.json, talos.txt, timeline-talos-*.svg.
# BENCH selects the benchmarks (default "plan upgrade talos"); BENCH_KEEP_LOGS=1
# keeps every cluster's logs; BENCH_POD_TERMINATION (a duration, default 0)
# makes every evicted pod of the upgrade clusters take that long to stop. Never fails on a timing: only when a cluster
# does not start, the plugin gives no plan or an upgrade does not succeed.
#
# What it needs is built when missing (hack/build.sh, hack/cluster-bins.sh,
# hack/talosctl.sh: cached, but a cold build takes long); what cannot be is
# named in one line. ICHOR_SIM, ICHOR_PLUGIN, ICHOR_CLUSTER_BINS and
# ICHOR_IMAGE_ROOT point elsewhere and are then only checked.
set -o errexit -o nounset -o pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
out=$root/_output/bench
benchmarks=${BENCH:-plan upgrade talos}
compare=${BENCH_COMPARE:-1}
sim=${ICHOR_SIM:-$root/_output/bin/ichor-sim}
plugin=${ICHOR_PLUGIN:-$root/_output/bin/kubectl-ichor}
bins=${ICHOR_CLUSTER_BINS:-$root/_output/cluster-bins}
image_root=${ICHOR_IMAGE_ROOT:-$root/_output/image/rootfs}
upgrade=0 # 1 when the Job runs: the upgrade or talos benchmark
peer=0    # 1 when the Kubernetes upgrade runs beside its peer, talosctl
case " $benchmarks " in *" upgrade "* | *" talos "*) upgrade=1 ;; esac
case " $benchmarks " in *" upgrade "*) [ "$compare" = 0 ] || peer=1 ;; esac

# missing says what is not there, in one line: "what (path: how to get it); ...".
missing() {
  local m=""
  add() { m="${m:+$m; }$1"; }
  [ -x "$sim" ] || add "ichor-sim ($sim: make build)"
  [ -x "$plugin" ] || add "kubectl-ichor ($plugin: make build)"
  local cp=""
  for b in etcd kube-apiserver kube-controller-manager kube-scheduler; do
    [ -x "$bins/$b" ] || cp="${cp:+$cp, }$b"
  done
  [ -z "$cp" ] || add "the control plane's $cp (in $bins: make cluster-bins)"
  if [ "$upgrade" = 1 ]; then
    [ -x "$image_root/usr/local/bin/kubectl-ichor" ] || add "the Job's image root ($image_root: make build)"
    if [ "$peer" = 1 ]; then
      [ -x "$bins/talosctl" ] || add "talosctl ($bins/talosctl: make cluster-bins, or BENCH_COMPARE=0)"
    fi
  fi
  echo "$m"
}

# Build what is missing, where it is built by default.
if [ -n "$(missing)" ]; then
  if [ -z "${ICHOR_SIM:-}${ICHOR_PLUGIN:-}${ICHOR_IMAGE_ROOT:-}" ] &&
    { [ ! -x "$sim" ] || [ ! -x "$plugin" ] || { [ "$upgrade" = 1 ] && [ ! -x "$image_root/usr/local/bin/kubectl-ichor" ]; }; }; then
    echo "bench: building the plugin and the simulator (hack/build.sh)"
    hack/build.sh
  fi
  if [ -z "${ICHOR_CLUSTER_BINS:-}" ]; then
    for b in etcd kube-apiserver kube-controller-manager kube-scheduler; do
      if [ ! -x "$bins/$b" ]; then
        echo "bench: getting the control plane (hack/cluster-bins.sh; a cold build takes long)"
        hack/cluster-bins.sh
        break
      fi
    done
    if [ "$peer" = 1 ] && [ ! -x "$bins/talosctl" ]; then
      echo "bench: getting talosctl, the peer (hack/talosctl.sh; a cold build takes long)"
      hack/talosctl.sh
    fi
  fi
fi
if [ -n "$(missing)" ]; then
  echo "bench: missing: $(missing)" >&2
  exit 1
fi
if [ "$upgrade" = 1 ] && [ "$(id -u)" != 0 ]; then
  echo "bench: the upgrade and talos benchmarks run the Job's pod as a process in a mount namespace: run them as root (or BENCH=plan)" >&2
  exit 1
fi

mkdir -p "$out"
go build -o "$out/bench" ./e2e/bench
# shellcheck disable=SC2086 # BENCH is a list of words
"$out/bench" \
  --sizes "${BENCH_SIZES:-5,1000,5000}" \
  --runs "${BENCH_RUNS:-5}" \
  --upgrade-sizes "${BENCH_UPGRADE_SIZES:-8,23,103:10}" \
  --talos-sizes "${BENCH_TALOS_SIZES:-23}" \
  --max-unavailable "${BENCH_MAX_UNAVAILABLE:-5}" \
  --pod-termination "${BENCH_POD_TERMINATION:-0}" \
  --compare="$([ "$compare" != 0 ] && echo true || echo false)" \
  --keep-logs="$([ "${BENCH_KEEP_LOGS:-0}" != 0 ] && echo true || echo false)" \
  --out "$out" \
  --sim "$sim" \
  --plugin "$plugin" \
  --bin-dir "$bins" \
  --image-root "$image_root" \
  $benchmarks
