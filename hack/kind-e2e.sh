#!/usr/bin/env bash
# make kind-e2e: the kind e2e tests (e2e/kind, a module of its own) on a kind
# cluster of ICHOR_KIND_NODES (default 3+2: control planes + workers) made
# from the node image of make kind-image (or ICHOR_KIND_IMAGE). The tests
# create the cluster through kind's Go library and delete it afterwards, also
# on failure and Ctrl-C; logs and the kubeconfig stay in
# _output/kind-e2e/<time>/.
set -o errexit -o nounset -o pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
image=${ICHOR_KIND_IMAGE:-$(cat "$root/_output/kind/node-image" 2>/dev/null || true)}
if [ -z "$image" ]; then
  echo "kind-e2e: no node image: run make kind-image or set ICHOR_KIND_IMAGE" >&2
  exit 1
fi
# Five nodes' kubelets, containerds and systemds share the host's inotify
# instances: at Linux's default of 128 the kubelet's log follow fails ("failed
# to create fsnotify watcher: too many open files"); kind's known-issues page
# asks for 512.
if [ "$(cat /proc/sys/fs/inotify/max_user_instances)" -lt 512 ]; then
  if sysctl -qw fs.inotify.max_user_instances=512 2>/dev/null; then
    echo "kind-e2e: raised fs.inotify.max_user_instances to 512 (kind's known issue: too many open files)"
  else
    echo "kind-e2e: fs.inotify.max_user_instances is $(cat /proc/sys/fs/inotify/max_user_instances); pods' logs may fail with \"too many open files\" (sysctl -w fs.inotify.max_user_instances=512)" >&2
  fi
fi
artifacts=${ICHOR_KIND_ARTIFACTS:-$root/_output/kind-e2e/$(date -u +%Y%m%dT%H%M%SZ)}
mkdir -p "$artifacts"
echo "kind-e2e: node image $image, artifacts in $artifacts"
start=$SECONDS
rc=0
# tee ignores Ctrl-C: the tests delete the cluster on it and must still be
# able to write.
(cd "$root/e2e/kind" && ICHOR_KIND_IMAGE=$image ICHOR_KIND_ARTIFACTS=$artifacts \
  go test -count=1 -v -timeout 60m "${@:-.}") 2>&1 | (trap '' INT; exec tee "$artifacts/test.log") || rc=$?
echo "kind-e2e: finished in $((SECONDS - start))s (exit $rc); logs in $artifacts"
exit "$rc"
