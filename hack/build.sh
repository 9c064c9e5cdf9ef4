#!/usr/bin/env bash
# Builds the plugin and the local cluster simulator into _output/bin.
set -o errexit -o nounset -o pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
version=${VERSION:-$(git describe --tags --always --dirty 2>/dev/null || echo dev)}
mkdir -p _output/bin
image=${IMAGE_REPO:-ghcr.io/ichor-dev/kubectl-ichor}:$version
ldflags="-X github.com/ichor-dev/kubectl-ichor/pkg/version.Version=$version"
ldflags+=" -X github.com/ichor-dev/kubectl-ichor/pkg/version.Image=$image"
CGO_ENABLED=0 go build -trimpath -ldflags "$ldflags" -o _output/bin/kubectl-ichor ./cmd/kubectl-ichor
CGO_ENABLED=0 go build -trimpath -o _output/bin/ichor-sim ./e2e/cmd/ichor-sim
# The image's root filesystem for the local cluster (ichor-sim up --image REPO=_output/image/rootfs).
install -D -m 0755 _output/bin/kubectl-ichor _output/image/rootfs/usr/local/bin/kubectl-ichor
echo "build: _output/bin/kubectl-ichor ($version) and _output/bin/ichor-sim"
