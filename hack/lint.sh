#!/usr/bin/env bash
# golangci-lint (pinned in hack/tools/lint/go.mod, config .golangci.yml) over
# the module and its e2e tests, and shellcheck over hack/. The linter is built
# from the pinned module once and kept in a per-user cache keyed by the pin,
# as hack/cluster-bins.sh keeps the control plane.
set -o errexit -o nounset -o pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
tools=$root/hack/tools/lint
key=$(cat "$tools/go.mod" "$tools/go.sum" | sha256sum | cut -c1-16)
cache=${ICHOR_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/kubectl-ichor}/lint/$key
lint=$cache/golangci-lint
if [ ! -x "$lint" ]; then
  echo "lint: building golangci-lint from hack/tools/lint (once per pin; a cold build takes minutes)"
  start=$SECONDS
  mkdir -p "$cache"
  (cd "$tools" && CGO_ENABLED=0 go build -trimpath -o "$lint.tmp" github.com/golangci/golangci-lint/v2/cmd/golangci-lint)
  mv "$lint.tmp" "$lint"
  echo "lint: built golangci-lint in $((SECONDS - start))s"
fi
"$lint" run --config "$root/.golangci.yml" ./...
shellcheck hack/*.sh
echo "lint: ok"
