#!/usr/bin/env bash
# make dist: the release archives krew installs, their sha256 sums, and the
# krew manifest rendered from the checked-in krew.yaml, checked with krew's
# own validate-krew-manifest. Everything lands in _output/dist:
#
#   kubectl-ichor_<version>_<os>_<arch>.tar.gz (.zip for windows): the plugin and LICENSE
#   kubectl-ichor_<version>_checksums.txt: sha256sum of every archive
#   ichor.yaml: the krew manifest, platform URIs under the GitHub release <version>
#
# DIST_PLATFORMS (os/arch words) builds fewer platforms, and the manifest then
# lists only those: make test builds this machine's alone for its krew install
# test ("DIST_PLATFORMS=host"), a release all six.
#
# Also: "hack/dist.sh version" prints the version a dist build stamps (semver,
# as krew wants: a tag v1.2.3..., else v0.0.0-<git describe>), and
# "hack/dist.sh binaries OS/ARCH..." builds only those binaries into
# _output/dist/bin/<os>_<arch>/ (hack/image.sh uses them for the image).
#
# The krew tools (krew, validate-krew-manifest) are built from the module
# proxy into _output/tools, pinned in hack/krew/go.mod. Binaries, archives and
# tools are rebuilt only when their inputs change.
set -o errexit -o nounset -o pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"

raw=${VERSION:-$(git describe --tags --always --dirty 2>/dev/null || echo dev)}
if [[ ! $raw =~ ^v[0-9]+\.[0-9]+\.[0-9]+ ]]; then
  raw=v0.0.0-$raw
fi
# A Docker tag and a semver prerelease both allow [0-9A-Za-z.-].
version=$(printf '%s' "$raw" | tr -c '0-9A-Za-z.-' '-')
image=${IMAGE_REPO:-ghcr.io/ichor-dev/kubectl-ichor}:$version
# Archive entries carry the commit's time, so a commit's archives are the same bytes.
mtime=${SOURCE_DATE_EPOCH:-$(git log -1 --format=%ct 2>/dev/null || echo 0)}

dist=$root/_output/dist
tools=$root/_output/tools
all_platforms=(linux/amd64 linux/arm64 darwin/amd64 darwin/arm64 windows/amd64 windows/arm64)
platforms=("${all_platforms[@]}")
if [ -n "${DIST_PLATFORMS:-}" ]; then
  read -r -a platforms <<< "${DIST_PLATFORMS//host/$(go env GOOS)/$(go env GOARCH)}"
  for p in "${platforms[@]}"; do
    if [[ ! " ${all_platforms[*]} " =~ \ $p\  ]]; then
      echo "dist: DIST_PLATFORMS: $p is not a release platform (${all_platforms[*]})" >&2
      exit 2
    fi
  done
fi

# binaries OS/ARCH...: static, stripped, stamped with the version and the
# image of the same version. go build leaves an up-to-date binary untouched.
binaries() {
  local ldflags="-s -w -X github.com/ichor-dev/kubectl-ichor/pkg/version.Version=$version"
  ldflags+=" -X github.com/ichor-dev/kubectl-ichor/pkg/version.Image=$image"
  local p os arch exe start
  for p in "$@"; do
    os=${p%/*} arch=${p#*/} exe=
    [ "$os" = windows ] && exe=.exe
    start=$SECONDS
    CGO_ENABLED=0 GOOS=$os GOARCH=$arch go build -trimpath -ldflags "$ldflags" \
      -o "$dist/bin/${os}_$arch/kubectl-ichor$exe" ./cmd/kubectl-ichor
    echo "dist: bin/${os}_$arch/kubectl-ichor$exe ($version, $((SECONDS - start))s)"
  done
}

# tools: the archiver and the manifest renderer (hack/krew), and krew itself
# with its manifest validator, from sigs.k8s.io/krew at the version pinned there.
tools() {
  local start=$SECONDS
  mkdir -p "$tools"
  (cd hack/krew && CGO_ENABLED=0 go build -trimpath -o "$tools/" ./archive ./render \
    sigs.k8s.io/krew/cmd/krew sigs.k8s.io/krew/cmd/validate-krew-manifest)
  echo "dist: tools krew, validate-krew-manifest, archive, render in _output/tools ($((SECONDS - start))s)"
}

case ${1:-all} in
version)
  echo "$version"
  exit 0
  ;;
binaries)
  shift
  binaries "$@"
  exit 0
  ;;
all) ;;
*)
  echo "usage: hack/dist.sh [version | binaries OS/ARCH...]" >&2
  exit 2
  ;;
esac

start=$SECONDS
mkdir -p "$dist"
# Archives of another version would end up in the checksums.
find "$dist" -maxdepth 1 \( -name 'kubectl-ichor_*' -o -name '.kubectl-ichor_*' \) \
  ! -name "kubectl-ichor_${version}_*" ! -name ".kubectl-ichor_${version}_*" -delete
only=()
if [ "${#platforms[@]}" != "${#all_platforms[@]}" ]; then
  only=(-platforms "${platforms[*]}")
fi
tools
binaries "${platforms[@]}"

archives=()
for p in "${platforms[@]}"; do
  os=${p%/*} arch=${p#*/} exe='' ext=tar.gz
  [ "$os" = windows ] && exe=.exe ext=zip
  bin=$dist/bin/${os}_$arch/kubectl-ichor$exe
  name=kubectl-ichor_${version}_${os}_$arch.$ext
  archives+=("$name")
  # go build touches an up-to-date binary, so the archive is keyed by content.
  key=$({ sha256sum "$bin" LICENSE "$tools/archive" | cut -c1-64; echo "$mtime"; } | sha256sum | cut -c1-16)
  if [ -f "$dist/$name" ] && [ "$(cat "$dist/.$name.key" 2>/dev/null)" = "$key" ]; then
    continue
  fi
  "$tools/archive" -out "$dist/$name" -mtime "$mtime" "$bin" LICENSE
  echo "$key" > "$dist/.$name.key"
done
(cd "$dist" && sha256sum "${archives[@]}" > "kubectl-ichor_${version}_checksums.txt")

"$tools/render" -template krew.yaml -tag "$version" -assets "$dist" -out "$dist/ichor.yaml" "${only[@]}"
# Structural validation only: its install step would download the URIs. The
# archives are installed with krew by make test (e2e/dist_test.go).
if ! out=$("$tools/validate-krew-manifest" -manifest "$dist/ichor.yaml" -skip-install 2>&1); then
  # klog.Fatal adds every goroutine's stack: keep its message.
  echo "dist: _output/dist/ichor.yaml is not a valid krew manifest (fix krew.yaml):" >&2
  echo "$out" | grep -m1 '^F' >&2 || echo "$out" >&2
  exit 1
fi
echo "$out" | sed -n 's/^I[^]]*] /dist: validate-krew-manifest: /p'

echo "dist: $version in _output/dist ($((SECONDS - start))s):"
(cd "$dist" && stat -c '%s %n' "${archives[@]}" "kubectl-ichor_${version}_checksums.txt" ichor.yaml | awk '{ printf "  %10d  %s\n", $1, $2 }')
