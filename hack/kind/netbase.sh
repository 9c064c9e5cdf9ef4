#!/usr/bin/env bash
# Writes into $2 the part of the kind base rootfs tarball $1 that kube-proxy
# needs in its image: iptables (nf_tables and legacy), nft, conntrack, their
# shared libraries and iptables' extensions, with the iptables commands
# pointing at the nf_tables backend (what this host's Docker uses too).
set -o errexit -o nounset -o pipefail

rootfs_tar=$1 out=$2
work=$(mktemp -d /var/tmp/ichor-kind-netbase.XXXXXX)
trap 'rm -rf "$work"' EXIT
r=$work/rootfs
mkdir -p "$r"
nice -n 19 ionice -c3 tar -C "$r" -xf "$rootfs_tar"
bins="/usr/sbin/xtables-nft-multi /usr/sbin/xtables-legacy-multi /usr/sbin/nft /usr/sbin/conntrack"
files=$(chroot "$r" /bin/sh -c "
  for f in $bins /usr/lib/x86_64-linux-gnu/xtables/*.so; do
    echo \$f
    ldd \$f | awk '\$2 == \"=>\" && \$3 ~ /^\\// { print \$3 } \$1 ~ /^\\// { print \$1 }'
  done" | sort -u)
mkdir -p "$out.tmp"
for f in $files /etc/ethertypes /etc/protocols /etc/nsswitch.conf; do
  [ -e "$r$f" ] || continue
  mkdir -p "$out.tmp$(dirname "$f")"
  cp -L "$r$f" "$out.tmp$f"
done
# The loader as the binaries name it (/lib64 is a symbolic link on Debian).
mkdir -p "$out.tmp/lib64" "$out.tmp/lib" "$out.tmp/usr/lib64"
cp -L "$r/lib64/ld-linux-x86-64.so.2" "$out.tmp/lib64/"
for c in iptables iptables-save iptables-restore ip6tables ip6tables-save ip6tables-restore; do
  ln -sf xtables-nft-multi "$out.tmp/usr/sbin/$c"
  ln -sf xtables-nft-multi "$out.tmp/usr/sbin/${c/tables/tables-nft}"
  ln -sf xtables-legacy-multi "$out.tmp/usr/sbin/${c/tables/tables-legacy}"
done
mkdir -p "$out.tmp/tmp" "$out.tmp/run" "$out.tmp/var/run"
rm -rf "$out"
mv "$out.tmp" "$out"
