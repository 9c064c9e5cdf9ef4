// Package kind holds the kind e2e tests (`make kind-e2e`): TestMain creates
// a kind cluster through kind's Go library from the node image of
// `make kind-image` (or ICHOR_KIND_IMAGE), the tests run against it, and it
// is deleted afterwards, also on failure and on Ctrl-C. It is a module of its
// own so that the main module's `go test ./...` and `go vet` never build it.
package kind
