# kubectl-ichor: a thin Makefile over hack/*.sh.
.DEFAULT_GOAL := build
SHELL := /usr/bin/env bash

VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
export VERSION

.PHONY: build cluster-bins test unit e2e demo bench verify dist dist-host image kind-image kind-e2e clean

build: ## Build _output/bin/kubectl-ichor and _output/bin/ichor-sim
	@hack/build.sh

cluster-bins: ## Build the real control plane (etcd, kube-apiserver, ...) and talosctl into _output/cluster-bins
	@hack/cluster-bins.sh
	@hack/talosctl.sh

test: verify build cluster-bins dist-host image ## Unit tests, then the local-cluster tests (with the dist and image tests)
	@hack/test.sh

unit: ## Unit tests only (no cluster)
	@go test ./...

e2e: build cluster-bins dist-host image ## Local-cluster tests only
	@hack/test.sh e2e

demo: build cluster-bins ## Start a 3+2 local cluster, show it, plan and upgrade, tear it down
	@hack/demo.sh

bench: build cluster-bins ## Benchmarks (never fail on a timing)
	@hack/bench.sh

verify: ## gofmt and go vet
	@hack/verify.sh

dist: ## Release archives (6 platforms), sha256 sums and the krew manifest ichor.yaml into _output/dist
	@hack/dist.sh

dist-host: ## make dist for this machine's platform only (what make test installs with krew)
	@DIST_PLATFORMS=host hack/dist.sh

image: ## The Job's image, no Docker daemon: OCI tarball _output/image/kubectl-ichor.tar (IMAGE_PLATFORMS, IMAGE_PUSH=1)
	@hack/image.sh

kind-image: ## A kind node image from local sources, no registry (Debian rootfs, Kubernetes KIND_K8S_VERSIONS); not part of make test
	@hack/kind-image.sh

kind-e2e: kind-image build image ## A kind cluster (ICHOR_KIND_NODES, default 3+2), its e2e tests, then deleted; not part of make test
	@hack/kind-e2e.sh

clean:
	rm -rf _output
