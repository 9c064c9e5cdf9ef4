#!/usr/bin/env bash
# Writes the tools module hack/kind/k8s-<version> that builds one Kubernetes
# version's binaries from module sources: it requires k8s.io/kubernetes at
# <version> and replaces every staging module at the matching v0.Y.Z, as
# hack/tools does for the local cluster. Run once per new version; the
# result (go.mod, go.sum) is committed.
set -o errexit -o nounset -o pipefail

version=${1:?usage: hack/kind/k8s-module.sh vX.Y.Z}
here=$(cd "$(dirname "$0")" && pwd)
dir=$here/k8s-$version
staging_version=v0.${version#v1.}
cmds="kubelet kubeadm kubectl kube-apiserver kube-controller-manager kube-scheduler kube-proxy"

k8s_gomod=$(go mod download -json "k8s.io/kubernetes@$version" | sed -n 's/^[[:space:]]*"GoMod": "\(.*\)",$/\1/p')
mkdir -p "$dir"
cd "$dir"
rm -f go.mod go.sum
go mod init "github.com/ichor-dev/kubectl-ichor/hack/kind/k8s-$version" 2> /dev/null
go mod edit -go=1.26.0 -require="k8s.io/kubernetes@$version"
while read -r m; do
  go mod edit -replace="$m=$m@$staging_version"
done < <(sed -n 's#^[[:space:]]*\(k8s.io/[a-z0-9-]*\) => ./staging/src/.*#\1#p' "$k8s_gomod")
for c in $cmds; do
  go mod edit -tool="k8s.io/kubernetes/cmd/$c"
done
go mod tidy
