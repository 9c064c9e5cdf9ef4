#!/usr/bin/env bash
# Every module of the repository is tidy: go mod tidy changes no go.mod or go.sum.
set -o errexit -o nounset -o pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
status=0
while IFS= read -r mod; do
  dir=$(dirname "$mod")
  if ! out=$(cd "$dir" && go mod tidy -diff 2>&1); then
    echo "$out" | head -20 >&2
    echo "verify: go mod tidy would change $dir/go.mod or go.sum (run: cd $dir && go mod tidy)" >&2
    status=1
  fi
done < <(git ls-files --cached --others --exclude-standard '*go.mod')
exit $status
