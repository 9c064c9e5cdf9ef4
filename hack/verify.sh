#!/usr/bin/env bash
# Every cheap check: no build output tracked, formatting and go vet.
set -o errexit -o nounset -o pipefail
cd "$(dirname "$0")/.."
hack/verify-files.sh
bad=$(git ls-files -z '*.go' | xargs -0 gofmt -l 2>/dev/null || true)
if [ -n "$bad" ]; then
  echo "verify: gofmt would change these files (run gofmt -w):" >&2
  echo "$bad" >&2
  exit 1
fi
go vet ./...
go vet -tags e2e ./e2e/...
echo "verify: ok"
