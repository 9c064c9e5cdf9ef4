#!/usr/bin/env bash
# make image: the image the in-cluster Job runs, built without a Docker daemon
# by hack/imagebuild (go-containerregistry) as an OCI image tarball, also
# loadable with docker load:
#
#   _output/image/kubectl-ichor.tar   ghcr.io/ichor-dev/kubectl-ichor:<version>
#
# The binary is hack/dist.sh's linux build, stamped with this very image
# reference, so the plugin's default --image is the image of its own version.
# The image holds the static binary at /usr/local/bin/kubectl-ichor (the
# entrypoint), runs as 65532:65532 and has no shell.
#
# Environment:
#   IMAGE_PLATFORMS  platforms to build (default: linux/<this machine's arch>);
#                    the tarball's docker manifest names the first
#   IMAGE_REPO       repository (default ghcr.io/ichor-dev/kubectl-ichor)
#   IMAGE_PUSH=1     also push the image (the index, for several platforms)
#                    with the credentials in ~/.docker/config.json
set -o errexit -o nounset -o pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"

version=$(hack/dist.sh version)
image=${IMAGE_REPO:-ghcr.io/ichor-dev/kubectl-ichor}:$version
read -r -a platforms <<< "${IMAGE_PLATFORMS:-linux/$(go env GOARCH)}"
out=$root/_output/image/kubectl-ichor.tar
tool=$root/_output/tools/imagebuild
created=${SOURCE_DATE_EPOCH:-$(git log -1 --format=%ct 2>/dev/null || echo 0)}
start=$SECONDS

hack/dist.sh binaries "${platforms[@]}"
mkdir -p "$(dirname "$out")" "$(dirname "$tool")"
(cd hack/imagebuild && CGO_ENABLED=0 go build -trimpath -o "$tool" .)

args=(-tag "$image" -version "$version" -created "$created" -out "$out")
if rev=$(git rev-parse HEAD 2>/dev/null); then
  args+=(-revision "$rev")
fi
for p in "${platforms[@]}"; do
  args+=(-binary "$p=$root/_output/dist/bin/${p%/*}_${p#*/}/kubectl-ichor")
done
if [ "${IMAGE_PUSH:-}" = 1 ]; then
  args+=(-push)
fi
"$tool" "${args[@]}"
echo "image: $image (${platforms[*]}) in $((SECONDS - start))s; load it with: docker load -i ${out#"$root"/}"
