#!/usr/bin/env bash
# Builds the real control plane the local cluster runs (kube-apiserver,
# kube-controller-manager, kube-scheduler, etcd) from module sources pinned in
# hack/tools, version-stamped, into _output/cluster-bins/. A binary already
# built from the same pins is kept. The built set is also kept in a per-user
# cache outside the tree, so a fresh clone on the same machine only copies it.
set -o errexit -o nounset -o pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
tools=$root/hack/tools
k8s_version=$(awk '$1 == "k8s.io/kubernetes" { print $2; exit }' "$tools/go.mod")
minor=$(echo "$k8s_version" | cut -d. -f2)

key=$(cat "$tools/go.mod" "$tools/go.sum" "$tools/etcd/main.go" "$0" | sha256sum | cut -c1-16)
out=$root/_output/cluster-bins
cache=${ICHOR_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/kubectl-ichor}/cluster-bins/$key
mkdir -p "$out"

ldflags="-s -w -X k8s.io/component-base/version.gitVersion=$k8s_version -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=$minor -X k8s.io/component-base/version.gitTreeState=clean"

build() {
  local name=$1 pkg=$2
  if [ -x "$out/$name" ] && [ "$(cat "$out/.$name.key" 2>/dev/null)" = "$key" ]; then
    echo "cluster-bins: $name is up to date"
    return
  fi
  if [ -x "$cache/$name" ]; then
    echo "cluster-bins: $name from the cache $cache"
    cp "$cache/$name" "$out/$name.tmp" && mv "$out/$name.tmp" "$out/$name"
    echo "$key" > "$out/.$name.key"
    return
  fi
  echo "cluster-bins: building $name ($pkg at $k8s_version); a cold build takes minutes"
  local start=$SECONDS
  (cd "$tools" && CGO_ENABLED=0 go build -trimpath -ldflags "$ldflags" -o "$out/$name.tmp" "$pkg")
  mv "$out/$name.tmp" "$out/$name"
  echo "$key" > "$out/.$name.key"
  mkdir -p "$cache" && cp "$out/$name" "$cache/$name.tmp" && mv "$cache/$name.tmp" "$cache/$name"
  echo "cluster-bins: built $name in $((SECONDS - start))s"
}

build etcd ./etcd
build kube-apiserver k8s.io/kubernetes/cmd/kube-apiserver
build kube-controller-manager k8s.io/kubernetes/cmd/kube-controller-manager
build kube-scheduler k8s.io/kubernetes/cmd/kube-scheduler
build kubectl k8s.io/kubernetes/cmd/kubectl
