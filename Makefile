# kubectl-ichor: a thin Makefile over hack/*.sh.
.DEFAULT_GOAL := build
SHELL := /usr/bin/env bash

VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
export VERSION

.PHONY: build cluster-bins test unit e2e demo bench verify clean

build: ## Build _output/bin/kubectl-ichor and _output/bin/ichor-sim
	@hack/build.sh

cluster-bins: ## Build the real control plane (etcd, kube-apiserver, ...) into _output/cluster-bins
	@hack/cluster-bins.sh

test: verify build cluster-bins ## Unit tests, then the local-cluster tests
	@hack/test.sh

unit: ## Unit tests only (no cluster)
	@go test ./...

e2e: build cluster-bins ## Local-cluster tests only
	@hack/test.sh e2e

demo: build cluster-bins ## Start a 3+2 local cluster, show it, plan and upgrade, tear it down
	@hack/demo.sh

bench: build cluster-bins ## Benchmarks (never fail on a timing)
	@hack/bench.sh

verify: ## gofmt and go vet
	@hack/verify.sh

clean:
	rm -rf _output
