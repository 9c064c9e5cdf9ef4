#!/usr/bin/env bash
# make kind-image: builds a kind node image from local sources, with no
# container registry (kind's `build node-image` pulls etcd, CoreDNS, pause,
# kindnetd). Every part is cached under ~/.cache/kubectl-ichor/kind by a key
# of its inputs, so a second run only assembles (or finds) the image:
#
#   base-<key>/rootfs.tar    bookworm by debootstrap, configured as kind's base
#                            image (hack/kind/rootfs.sh), Docker image
#                            ichor-kind-base:<key>
#   k8s-<version>-<key>/     kubelet, kubeadm, kubectl, kube-apiserver,
#                            kube-controller-manager, kube-scheduler, kube-proxy
#                            from hack/kind/k8s-<version> (hack/kind/k8s-bins.sh)
#   etcd-<key>, coredns-<key>, tools-<key>   etcd v3.6.8 (hack/tools), CoreDNS
#                            (hack/kind/coredns), pause, podroutes (the CNI
#                            daemon) and mkimage (hack/kind/tools)
#   images-<key>/*.tar       the component images, made by mkimage
#
# The node image ichor-kind-node:<first version>-<key> holds the first
# version's kubelet, kubeadm and kubectl in /usr/bin (what kind runs) and every
# version's binaries in /kind/k8s/<version>/, with all the versions' component
# images in containerd. Its name is written to _output/kind/node-image.
#
# Environment:
#   KIND_K8S_VERSIONS  Kubernetes versions, space separated, first is the one
#                      the cluster starts on (default: v1.35.4 v1.36.3, what
#                      the upgrade tests need); each needs its
#                      module: hack/kind/k8s-module.sh <version>
#   ICHOR_CACHE_DIR    cache root (default ~/.cache/kubectl-ichor)
set -o errexit -o nounset -o pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
kind=$root/hack/kind
read -r -a versions <<< "${KIND_K8S_VERSIONS:-v1.35.4 v1.36.3}"
cache=${ICHOR_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/kubectl-ichor}/kind
export KIND_VERSION=v0.33.0
start=$SECONDS
mkdir -p "$cache" "$root/_output/kind"

key() { cat "$@" | sha256sum | cut -c1-12; }
nicely() { nice -n 19 ionice -c3 "$@"; }
# gobuild DIR OUT PKG...: a static, trimmed build in the module DIR.
gobuild() {
  local dir=$1 out=$2
  shift 2
  (cd "$dir" && CGO_ENABLED=0 nicely go build -trimpath -ldflags "-s -w" -o "$out" "$@")
}

# 1. The base image.
base_key=$(echo "$KIND_VERSION" | key - "$kind/packages.txt" "$kind/rootfs.sh" "$kind/entrypoint")
base_image=ichor-kind-base:$base_key
"$kind/rootfs.sh" "$base_image" "$cache/base-$base_key"
if [ ! -d "$cache/base-$base_key/netbase" ]; then
  "$kind/netbase.sh" "$cache/base-$base_key/rootfs.tar" "$cache/base-$base_key/netbase"
fi

# 2. Small tools, etcd, CoreDNS.
tools_key=$(key "$kind"/tools/go.* "$kind"/tools/*/*.go)
tools=$cache/tools-$tools_key
if [ ! -x "$tools/podroutes" ]; then
  echo "kind-image: building mkimage, pause, podroutes"
  gobuild "$kind/tools" "$tools.tmp/" ./mkimage ./pause ./podroutes ./lb
  mv "$tools.tmp" "$tools"
fi
etcd_dir=$cache/etcd-$(key "$root"/hack/tools/go.* "$root/hack/tools/etcd/main.go")
if [ ! -x "$etcd_dir/etcd" ]; then
  echo "kind-image: building etcd (hack/tools)"
  gobuild "$root/hack/tools" "$etcd_dir.tmp/etcd" ./etcd
  mv "$etcd_dir.tmp" "$etcd_dir"
fi
coredns_version=$(awk '$1 == "github.com/coredns/coredns" { print $2 }' "$kind/coredns/go.mod")
coredns_dir=$cache/coredns-$(key "$kind"/coredns/*)
if [ ! -x "$coredns_dir/coredns" ]; then
  echo "kind-image: building CoreDNS $coredns_version (minutes)"
  gobuild "$kind/coredns" "$coredns_dir.tmp/coredns" .
  mv "$coredns_dir.tmp" "$coredns_dir"
fi

# 3. Kubernetes, per version.
declare -A k8s_dir
for v in "${versions[@]}"; do
  k8s_dir[$v]=$cache/k8s-$v-$(key "$kind/k8s-$v"/go.* "$kind/k8s-bins.sh")
  "$kind/k8s-bins.sh" "$v" "${k8s_dir[$v]}"
done

# 4. Component images, named as kubeadm of each version asks for them.
mkimage=$tools/mkimage
images_key=$(key "$0" <(printf '%s\n' "$base_key" "$tools" "$etcd_dir" "$coredns_dir" "${k8s_dir[@]}"))
images=$cache/images-$images_key
declare -A wanted
for v in "${versions[@]}"; do
  while read -r ref; do wanted[$ref]=1; done < <("${k8s_dir[$v]}/kubeadm" config images list --kubernetes-version "$v")
done
mkdir -p "$images"
mk() { # mk REF ARGS...: the image REF, made unless already in the cache.
  local ref=$1 file
  shift
  file=$images/$(echo "$ref" | tr '/:' '__').tar
  [ -s "$file" ] && return
  nicely "$mkimage" -tag "$ref" -out "$file.tmp" "$@"
  mv "$file.tmp" "$file"
}
for ref in "${!wanted[@]}"; do
  name=${ref##*/}
  name=${name%%:*}
  case $name in
    kube-apiserver|kube-controller-manager|kube-scheduler)
      v=${ref##*:}
      mk "$ref" -add "${k8s_dir[$v]}/$name=/usr/local/bin/$name" ;;
    kube-proxy)
      v=${ref##*:}
      mk "$ref" -add "$cache/base-$base_key/netbase=/" -add "${k8s_dir[$v]}/kube-proxy=/usr/local/bin/kube-proxy" ;;
    etcd)
      mk "$ref" -add "$etcd_dir/etcd=/usr/local/bin/etcd" ;;
    coredns)
      mk "$ref" -add "$coredns_dir/coredns=/coredns" -entrypoint /coredns ;;
    pause)
      mk "$ref" -add "$tools/pause=/pause" -entrypoint /pause
      pause_ref=$ref ;;
    *) echo "kind-image: kubeadm asks for $ref, which this script cannot build" >&2; exit 1 ;;
  esac
done
mk ichor.local/podroutes:v1 -add "$tools/podroutes=/usr/local/bin/podroutes" -entrypoint /usr/local/bin/podroutes

# 5. The node image.
node_key=$(key <(printf '%s\n' "$images_key" "$KIND_VERSION") "$kind/default-cni.yaml" "$kind/default-storage.yaml")
node_image=ichor-kind-node:${versions[0]}-$node_key
if docker image inspect "$node_image" > /dev/null 2>&1; then
  echo "kind-image: $node_image is up to date"
else
  echo "kind-image: assembling $node_image"
  c=$(docker run -d --entrypoint sleep --cap-add ALL --cap-drop SYS_RESOURCE \
    --security-opt seccomp=unconfined --security-opt apparmor=unconfined "$base_image" infinity)
  trap 'docker rm -f "$c" > /dev/null' EXIT
  for v in "${versions[@]}"; do
    docker exec "$c" mkdir -p "/kind/k8s/$v"
    for f in "${k8s_dir[$v]}"/*; do docker cp "$f" "$c:/kind/k8s/$v/"; done
  done
  for b in kubelet kubeadm kubectl; do
    docker exec "$c" ln -sf "/kind/k8s/${versions[0]}/$b" "/usr/bin/$b"
  done
  docker exec "$c" sh -c "echo ${versions[0]} > /kind/version && mkdir -p /kind/manifests /kind/images"
  docker cp "$kind/default-cni.yaml" "$c:/kind/manifests/default-cni.yaml"
  docker cp "$kind/default-storage.yaml" "$c:/kind/manifests/default-storage.yaml"
  docker exec "$c" sed -i "s#sandbox_image = .*#sandbox_image = \"$pause_ref\"#" /etc/containerd/config.toml
  for f in "$images"/*.tar; do docker cp "$f" "$c:/kind/images/"; done
  docker exec "$c" sh -euc '
    containerd > /tmp/containerd.log 2>&1 &
    pid=$!
    for i in $(seq 60); do ctr version > /dev/null 2>&1 && break; sleep 1; done
    for f in /kind/images/*.tar; do
      ctr -n k8s.io images import --label=io.cri-containerd.pinned=pinned --all-platforms --no-unpack --digests "$f" > /dev/null
    done
    ctr -n k8s.io images ls -q
    kill $pid; wait $pid || true
    rm -rf /kind/images /tmp/containerd.log'
  docker commit --change 'ENTRYPOINT ["/usr/local/bin/entrypoint", "/sbin/init"]' "$c" "$node_image" > /dev/null
fi
# 6. kind's control-plane load balancer, for clusters of several control
# planes: lb (hack/kind/tools/lb) under the envoy image's name kind runs, with
# busybox (the host's busybox-static) for the shell commands kind sends it.
lb_image=$(awk -F'"' '/^const Image/ { print $2 }' "$(go mod download -json "sigs.k8s.io/kind@$KIND_VERSION" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')/pkg/cluster/internal/loadbalancer/const.go")
if ! docker image inspect "$lb_image" > /dev/null 2>&1; then
  busybox=$(command -v busybox || true)
  # ldd fails on a static executable ("not a dynamic executable").
  if [ -z "$busybox" ] || ldd "$busybox" > /dev/null 2>&1; then
    echo "kind-image: a static busybox is needed for the load balancer image: apt-get install busybox-static" >&2
    exit 1
  fi
  lbroot=$(mktemp -d)
  mkdir -p "$lbroot/bin" "$lbroot/home/envoy"
  cp "$busybox" "$lbroot/bin/busybox"
  for a in sh mkdir cat cp chmod mv sleep ls rm true; do ln -s busybox "$lbroot/bin/$a"; done
  printf '#!/bin/sh\nexec /bin/busybox sh "$@"\n' > "$lbroot/bin/bash"
  chmod 0755 "$lbroot/bin/bash"
  cp "$tools/lb" "$lbroot/bin/envoy"
  "$mkimage" -tag "$lb_image" -out "$lbroot.tar" -add "$lbroot=/"
  docker load -i "$lbroot.tar" > /dev/null
  rm -rf "$lbroot" "$lbroot.tar"
  echo "kind-image: $lb_image is the local load balancer (hack/kind/tools/lb)"
fi
echo "$node_image" > "$root/_output/kind/node-image"
echo "kind-image: $node_image ready in $((SECONDS - start))s (cache $(du -sh "$cache" | cut -f1) in $cache)"
