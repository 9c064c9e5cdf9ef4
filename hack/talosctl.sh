#!/usr/bin/env bash
# Builds talosctl from Talos' own source, the module github.com/siderolabs/talos
# pinned in hack/talosctl, into _output/cluster-bins/talosctl: the local-cluster
# tests run it against the simulated machines, as an operator would. It has
# talosctl's commands for running clusters (hack/talosctl/main.go says why not
# the offline ones). Like the
# control plane (hack/cluster-bins.sh), a binary already built from the same pin
# is kept, and the build is cached outside the tree for other clones on this
# machine. A cold build takes long (talosctl is large: most of an hour on 2 busy
# cores); Go's build cache keeps it after that.
#
# hack/talosctl's go.mod differs from Talos' own where this machine's module
# proxy does not serve what Talos pins: its forks of wgctrl-go and ethtool, and
# cosi-project/runtime v1.16.3 and its rtnetlink (replaced as in the main
# module).
set -o errexit -o nounset -o pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
mod=$root/hack/talosctl
key=$(cat "$mod/go.mod" "$mod/go.sum" "$mod/main.go" "$0" | sha256sum | cut -c1-16)
out=$root/_output/cluster-bins
cache=${ICHOR_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/kubectl-ichor}/talosctl/$key
mkdir -p "$out"

if [ -x "$out/talosctl" ] && [ "$(cat "$out/.talosctl.key" 2>/dev/null)" = "$key" ]; then
  echo "talosctl: up to date"
  exit 0
fi
if [ -x "$cache/talosctl" ]; then
  echo "talosctl: from the cache $cache"
  cp "$cache/talosctl" "$out/talosctl.tmp" && mv "$out/talosctl.tmp" "$out/talosctl"
  echo "$key" > "$out/.talosctl.key"
  exit 0
fi
version=$(awk '$1 == "github.com/siderolabs/talos" { print $2; exit }' "$mod/go.mod")
echo "talosctl: building talosctl $version from its module source; a cold build takes long"
start=$SECONDS
(cd "$mod" && CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o "$out/talosctl.tmp" .)
mv "$out/talosctl.tmp" "$out/talosctl"
echo "$key" > "$out/.talosctl.key"
mkdir -p "$cache" && cp "$out/talosctl" "$cache/talosctl.tmp" && mv "$cache/talosctl.tmp" "$cache/talosctl"
echo "talosctl: built in $((SECONDS - start))s"
