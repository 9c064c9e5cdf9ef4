#!/usr/bin/env bash
# hack/need.sh TARGET NEED...: checks what `make TARGET` needs before it starts,
# and stops in one line naming what to install, e.g.
#
#   make kind-image: needs debootstrap and busybox-static: apt-get install debootstrap busybox-static
#
# Each NEED is one of:
#   go              Go at least the version go.mod asks for (a newer toolchain
#                   that GOTOOLCHAIN lets go fetch counts: go installs it, as it
#                   does the modules)
#   root            root (the local cluster's Job pods get a private mount
#                   namespace; debootstrap and chroot)
#   docker          the docker command and a Docker daemon it can reach
#   busybox-static  a statically linked busybox
#   COMMAND:PACKAGE the command, from that Debian package
# Every make target's script calls it first; it prints nothing when all is there.
set -o errexit -o nounset -o pipefail

target=${1:?usage: hack/need.sh TARGET NEED...}
shift
root=$(cd "$(dirname "$0")/.." && pwd)

packages=() # Debian packages to install
others=()   # what apt-get does not give, each "what: how"

has() { command -v "$1" > /dev/null 2>&1; }

need_go() {
  local want have
  want=$(awk '$1 == "go" { print $2; exit }' "$root/go.mod")
  if ! has go; then
    others+=("Go $want or newer: https://go.dev/dl/ (then put its bin directory on PATH)")
    return
  fi
  # In the module, go switches to the toolchain go.mod asks for when
  # GOTOOLCHAIN allows it (fetching it once), or fails.
  if ! have=$(cd "$root" && go env GOVERSION 2> /dev/null); then
    have=$(cd / && go env GOVERSION 2> /dev/null || echo unknown)
    others+=("Go $want or newer (this go is ${have#go}, GOTOOLCHAIN=$(cd / && go env GOTOOLCHAIN)): https://go.dev/dl/")
    return
  fi
  have=${have#go}
  if [ "$(printf '%s\n%s\n' "$want" "$have" | sort -V | head -1)" != "$want" ]; then
    others+=("Go $want or newer (this go is $have): https://go.dev/dl/")
  fi
}

for n in "$@"; do
  case $n in
    go) need_go ;;
    root)
      [ "$(id -u)" = 0 ] || others+=("root: run it as root (e.g. sudo --preserve-env=PATH make $target)") ;;
    docker)
      if ! has docker; then
        packages+=(docker.io)
      elif ! docker info > /dev/null 2>&1; then
        others+=("a running Docker daemon that this user may reach: start it (systemctl start docker), or run as root or a member of the docker group")
      fi ;;
    busybox-static)
      # ldd fails on a static executable ("not a dynamic executable").
      if ! has busybox || ldd "$(command -v busybox)" > /dev/null 2>&1; then
        packages+=(busybox-static)
      fi ;;
    *:*)
      has "${n%%:*}" || packages+=("${n#*:}") ;;
    *)
      echo "hack/need.sh: unknown need $n" >&2
      exit 2 ;;
  esac
done

if [ ${#packages[@]} -eq 0 ] && [ ${#others[@]} -eq 0 ]; then
  exit 0
fi

# "a", "a and b", "a, b and c"
and() {
  local out=$1
  shift
  while [ $# -gt 1 ]; do
    out+=", $1"
    shift
  done
  [ $# -eq 1 ] && out+=" and $1"
  printf '%s' "$out"
}

mapfile -t packages < <(printf '%s\n' "${packages[@]}" | awk 'NF && !seen[$0]++')
line="make $target: needs "
if [ ${#packages[@]} -gt 0 ]; then
  line+="$(and "${packages[@]}")"
  if [ ${#others[@]} -eq 0 ]; then
    line+=": apt-get install ${packages[*]}"
  else
    line+=" (apt-get install ${packages[*]}), and "
  fi
fi
if [ ${#others[@]} -gt 0 ]; then
  line+=${others[0]}
  for o in "${others[@]:1}"; do
    line+="; and $o"
  done
fi
echo "$line" >&2
exit 1
