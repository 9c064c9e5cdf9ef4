#!/usr/bin/env bash
# Builds the kind base image from Debian packages, with no registry: a
# bookworm rootfs by debootstrap, configured as kind's images/base Dockerfile
# does (kind's own files from the sigs.k8s.io/kind module), imported into
# Docker as $1. The rootfs tarball is cached in $2.
#
# Debian's containerd (1.6) and runc stand in for kind's own builds; kind's
# containerd config is v2 and works with it. bookworm's systemd runs on
# cgroup v1 (trixie's refuses it).
set -o errexit -o nounset -o pipefail

image=$1 cache=$2
here=$(cd "$(dirname "$0")" && pwd)
mirror=${ICHOR_DEBIAN_MIRROR:-http://deb.debian.org/debian}
kind_version=${KIND_VERSION:-v0.33.0}
kind_dir=$(go mod download -json "sigs.k8s.io/kind@$kind_version" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')
packages=$(tr '\n' ',' < "$here/packages.txt" | sed 's/,$//')

if [ ! -s "$cache/rootfs.tar" ]; then
  start=$SECONDS
  work=$(mktemp -d /var/tmp/ichor-kind-rootfs.XXXXXX)
  trap 'umount -R "$work/rootfs/proc" 2>/dev/null || true; rm -rf "$work"' EXIT
  echo "kind-image: debootstrap bookworm into $work (a few minutes)"
  nice -n 19 ionice -c3 debootstrap --variant=minbase --include="$packages" bookworm "$work/rootfs" "$mirror" \
    > "$work/debootstrap.log" 2>&1 || { tail -30 "$work/debootstrap.log"; exit 1; }
  r=$work/rootfs
  # kind's static files (images/base/files), as its Dockerfile copies them.
  src=$kind_dir/images/base/files
  install -d -m 0755 "$r/kind/bin" "$r/LICENSES" "$r/etc/containerd" "$r/etc/kubernetes/manifests" \
    "$r/etc/systemd/system/kubelet.service.d" "$r/opt/cni"
  install -m 0755 "$src"/usr/local/bin/* "$r/usr/local/bin/"
  install -m 0755 "$src"/kind/bin/* "$r/kind/bin/"
  install -m 0644 "$src"/etc/crictl.yaml "$r/etc/"
  install -m 0644 "$src"/etc/containerd/* "$r/etc/containerd/"
  install -m 0644 "$src"/etc/default/* "$r/etc/default/"
  install -m 0644 "$src"/etc/sysctl.d/* "$r/etc/sysctl.d/"
  install -m 0644 "$src"/etc/systemd/system/*.service "$src"/etc/systemd/system/*.slice "$r/etc/systemd/system/"
  install -m 0644 "$src"/etc/systemd/system/kubelet.service.d/* "$r/etc/systemd/system/kubelet.service.d/"
  # Debian's containerd, runc and CNI plugins where kind's files expect its own.
  ln -sf /usr/bin/containerd /usr/bin/ctr /usr/bin/containerd-shim-runc-v2 "$r/usr/local/bin/"
  ln -sf /usr/sbin/runc "$r/usr/local/sbin/runc"
  ln -sfn /usr/lib/cni "$r/opt/cni/bin"
  # No CAP_SYS_RESOURCE on this kind of host: containerd must not raise oom_score_adj.
  sed -i 's/restrict_oom_score_adj = false/restrict_oom_score_adj = true/' "$r/etc/containerd/config.toml"
  # The cgroup v1 hierarchies are read-only without --privileged: remount them
  # read-write before kind's entrypoint runs (remount,rw alone answers EBUSY).
  mv "$r/usr/local/bin/entrypoint" "$r/usr/local/bin/entrypoint.kind"
  install -m 0755 "$here/entrypoint" "$r/usr/local/bin/entrypoint"
  mount -t proc proc "$r/proc"
  chroot "$r" /bin/sh -euc '
    ctr oci spec \
      | jq ".hooks.createContainer[.hooks.createContainer| length] |= . + {\"path\": \"/kind/bin/mount-product-files.sh\"}" \
      | jq "del(.process.rlimits)" > /etc/containerd/cri-base.json
    find /lib/systemd/system/sysinit.target.wants/ -name systemd-tmpfiles-setup.service -delete
    rm -f /lib/systemd/system/multi-user.target.wants/* /etc/systemd/system/*.wants/* \
      /lib/systemd/system/local-fs.target.wants/* /lib/systemd/system/sockets.target.wants/*udev* \
      /lib/systemd/system/sockets.target.wants/*initctl* /lib/systemd/system/basic.target.wants/*
    echo ReadKMsg=no >> /etc/systemd/journald.conf
    ln -sf /usr/lib/systemd/systemd /sbin/init
    systemctl enable kubelet.service containerd.service undo-mount-hacks.service
    systemctl mask systemd-binfmt.service
    apt-get clean
    rm -rf /var/lib/apt/lists/* /var/log/* /var/cache/debconf/*-old
  '
  umount "$r/proc"
  mkdir -p "$cache"
  tar -C "$r" --numeric-owner -cf "$cache/rootfs.tar.tmp" .
  mv "$cache/rootfs.tar.tmp" "$cache/rootfs.tar"
  echo "kind-image: rootfs built in $((SECONDS - start))s ($(du -sh "$cache/rootfs.tar" | cut -f1))"
fi

if ! docker image inspect "$image" > /dev/null 2>&1; then
  echo "kind-image: importing $image"
  nice -n 19 ionice -c3 docker import --change 'ENV container=docker' \
    --change 'ENTRYPOINT ["/usr/local/bin/entrypoint", "/sbin/init"]' "$cache/rootfs.tar" "$image.import" > /dev/null
  # docker import --change cannot set STOPSIGNAL on Docker 20.10: a two-line
  # Dockerfile on the local image adds it with no pull.
  d=$(mktemp -d)
  printf 'FROM %s\nSTOPSIGNAL SIGRTMIN+3\n' "$image.import" > "$d/Dockerfile"
  DOCKER_BUILDKIT=0 nice -n 19 ionice -c3 docker build -q -t "$image" "$d" > /dev/null
  docker rmi "$image.import" > /dev/null
  rm -rf "$d"
fi
