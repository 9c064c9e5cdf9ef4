#!/usr/bin/env bash
# Builds one Kubernetes version's node and control-plane binaries from the
# tools module hack/kind/k8s-<version>, version-stamped as release builds
# are, into $2 (kept there: a second run only checks they exist).
set -o errexit -o nounset -o pipefail

version=$1 out=$2
here=$(cd "$(dirname "$0")" && pwd)
mod=$here/k8s-$version
cmds="kubelet kubeadm kubectl kube-apiserver kube-controller-manager kube-scheduler kube-proxy"
[ -f "$mod/go.mod" ] || { echo "kind-image: no module for $version: run hack/kind/k8s-module.sh $version" >&2; exit 1; }

missing=
for c in $cmds; do [ -x "$out/$c" ] || missing="$missing k8s.io/kubernetes/cmd/$c"; done
if [ -z "$missing" ]; then
  echo "kind-image: Kubernetes $version binaries from the cache $out"
  exit 0
fi
minor=$(echo "$version" | cut -d. -f2)
ldflags="-s -w -X k8s.io/component-base/version.gitVersion=$version -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=$minor -X k8s.io/component-base/version.gitTreeState=clean"
echo "kind-image: building Kubernetes $version:$missing (a cold build takes tens of minutes)"
start=$SECONDS
mkdir -p "$out.tmp"
# shellcheck disable=SC2086 # $missing is a list of packages
(cd "$mod" && CGO_ENABLED=0 nice -n 19 ionice -c3 go build -trimpath -ldflags "$ldflags" -o "$out.tmp/" $missing)
mkdir -p "$out"
for f in "$out.tmp"/*; do mv "$f" "$out/"; done
rmdir "$out.tmp"
echo "kind-image: built Kubernetes $version in $((SECONDS - start))s"
