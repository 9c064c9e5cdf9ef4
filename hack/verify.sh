#!/usr/bin/env bash
# Every check that needs no cluster: no build output tracked, every module
# tidy, formatting, go vet, golangci-lint and shellcheck.
set -o errexit -o nounset -o pipefail
cd "$(dirname "$0")/.."
hack/verify-files.sh
hack/verify-tidy.sh
bad=$(git ls-files -z '*.go' | xargs -0 gofmt -l 2>/dev/null || true)
if [ -n "$bad" ]; then
  echo "verify: gofmt would change these files (run gofmt -w):" >&2
  echo "$bad" >&2
  exit 1
fi
go vet ./...
go vet -tags e2e ./e2e/...
hack/lint.sh
echo "verify: ok"
