# kubectl-ichor: a thin Makefile over hack/*.sh.
.DEFAULT_GOAL := build
SHELL := /usr/bin/env bash

VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
export VERSION

# What each target needs on this machine, checked before it (and its prerequisites)
# start: hack/need.sh stops it in one line saying what to install. Go fetches the
# modules (and a newer toolchain, when GOTOOLCHAIN allows) itself. The local cluster
# (test, e2e, demo, bench) runs the Job's pods in a private mount namespace: root.
NEED_GO    := go
NEED_LOCAL := go root
NEED_KIND  := go root docker debootstrap:debootstrap busybox-static ionice:util-linux tar:tar
need = @hack/need.sh $(1) $(2)

.PHONY: build cluster-bins test unit e2e demo soak bench verify dist dist-host image kind-image kind-e2e clean
.PHONY: need-test need-e2e need-demo need-soak need-bench need-kind-e2e

build: ## Build _output/bin/kubectl-ichor and _output/bin/ichor-sim
	$(call need,build,$(NEED_GO))
	@hack/build.sh

cluster-bins: ## Build the real control plane (etcd, kube-apiserver, ...) and talosctl into _output/cluster-bins
	$(call need,cluster-bins,$(NEED_GO))
	@hack/cluster-bins.sh
	@hack/talosctl.sh

test: need-test verify build cluster-bins dist-host image ## Unit tests, then the local-cluster tests (with the dist and image tests)
	@hack/test.sh
need-test:
	$(call need,test,$(NEED_LOCAL) git:git)

unit: ## Unit tests only (no cluster)
	$(call need,unit,$(NEED_GO))
	@go test ./...

e2e: need-e2e build cluster-bins dist-host image ## Local-cluster tests only
	@hack/test.sh e2e
need-e2e:
	$(call need,e2e,$(NEED_LOCAL))

demo: need-demo build cluster-bins ## Start a 3+2 local cluster, show it, plan and upgrade, tear it down
	@hack/demo.sh
need-demo:
	$(call need,demo,$(NEED_LOCAL))

soak: need-soak build cluster-bins ## The fault soak: SOAK_RUNS seeded upgrades under random faults, judged apart (SOAK_SEED, SOAK_TIMEOUT); not part of make test
	@hack/soak.sh
need-soak:
	$(call need,soak,$(NEED_LOCAL))

bench: need-bench build cluster-bins ## Benchmarks (never fail on a timing)
	@hack/bench.sh
need-bench:
	$(call need,bench,$(NEED_LOCAL))

verify: ## No build output tracked, go mod tidy, gofmt, go vet, golangci-lint, shellcheck
	$(call need,verify,$(NEED_GO) git:git shellcheck:shellcheck)
	@hack/verify.sh

dist: ## Release archives (6 platforms), sha256 sums and the krew manifest ichor.yaml into _output/dist
	$(call need,dist,$(NEED_GO))
	@hack/dist.sh

dist-host: ## make dist for this machine's platform only (what make test installs with krew)
	$(call need,dist-host,$(NEED_GO))
	@DIST_PLATFORMS=host hack/dist.sh

image: ## The Job's image, no Docker daemon: OCI tarball _output/image/kubectl-ichor.tar (IMAGE_PLATFORMS, IMAGE_PUSH=1)
	$(call need,image,$(NEED_GO))
	@hack/image.sh

kind-image: ## A kind node image from local sources, no registry (Debian rootfs, Kubernetes KIND_K8S_VERSIONS); not part of make test
	$(call need,kind-image,$(NEED_KIND))
	@hack/kind-image.sh

kind-e2e: need-kind-e2e kind-image build image ## A kind cluster (ICHOR_KIND_NODES, default 3+2), its e2e tests, then deleted; not part of make test
	@hack/kind-e2e.sh
need-kind-e2e:
	$(call need,kind-e2e,$(NEED_KIND))

clean:
	rm -rf _output
