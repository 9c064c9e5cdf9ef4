package checks

import (
	"context"
	"fmt"
	"net"
	"net/url"

	api "github.com/ichor-dev/kubectl-ichor/pkg/api/v1alpha1"
	"github.com/ichor-dev/kubectl-ichor/pkg/compat"
	"github.com/ichor-dev/kubectl-ichor/pkg/discovery"
	"github.com/ichor-dev/kubectl-ichor/pkg/render"
	"github.com/ichor-dev/kubectl-ichor/pkg/stages"
)

// VersionSkew refuses a target that is a downgrade or skips a minor for any component any
// node runs, judged per node against what it runs (kubelet, machine config, mirror pods).
type VersionSkew struct{}

// Name implements Check.
func (VersionSkew) Name() string { return compat.NameKubernetesStep }

// Run implements Check.
func (VersionSkew) Run(_ context.Context, in *Input) api.Check {
	return compat.KubernetesStep(compat.FromSnapshot(in.Snapshot), compat.Version(in.Target)).Check(VersionSkew{}.Name())
}

// TalosPairing refuses a Kubernetes target that a node's Talos does not support, and a
// Talos minor this build does not know.
type TalosPairing struct{}

// Name implements Check.
func (TalosPairing) Name() string { return compat.NameKubernetesSupported }

// Run implements Check.
func (TalosPairing) Run(_ context.Context, in *Input) api.Check {
	return compat.KubernetesSupported(compat.FromSnapshot(in.Snapshot), compat.Version(in.Target)).Check(TalosPairing{}.Name())
}

// Endpoint warns when a minor upgrade of several control planes goes through an endpoint
// that is a single control plane: the API is gone while that node's apiserver restarts.
type Endpoint struct{}

// Name implements Check.
func (Endpoint) Name() string { return "endpoint" }

// Run implements Check.
func (Endpoint) Run(_ context.Context, in *Input) api.Check {
	cps := in.Snapshot.ControlPlanes()
	if len(cps) < 2 {
		return ok(fmt.Sprintf("%d control plane: the API is unreachable while its apiserver restarts, whatever the endpoint", len(cps)))
	}

	minor := false

	for _, n := range cps {
		if v, err := stages.ParseVersion(n.KubeletVersion); err == nil && !v.SameMinor(in.Target) {
			minor = true
		}

		if sp, found := n.StaticPods[discovery.APIServer]; found {
			if v, err := stages.ParseVersion(render.TagOf(sp.Image)); err == nil && !v.SameMinor(in.Target) {
				minor = true
			}
		}
	}

	if !minor {
		return ok("patch upgrade: the apiservers restart one at a time")
	}

	u, err := url.Parse(in.Snapshot.Endpoint)
	if err != nil || u.Host == "" {
		return warn(fmt.Sprintf("cannot tell what the endpoint %q is", in.Snapshot.Endpoint), "make sure it balances over every control plane")
	}

	host := u.Hostname()

	for _, n := range cps {
		if host == n.InternalIP || host == n.Name || sameIP(host, n.InternalIP) {
			return warn(fmt.Sprintf("%s is a single control plane (%s): the API is unreachable while its apiserver restarts", in.Snapshot.Endpoint, n.Name),
				"use a VIP or a load balancer over every control plane as the endpoint")
		}
	}

	return ok(fmt.Sprintf("%s is not a single control plane's address", in.Snapshot.Endpoint))
}

func sameIP(a, b string) bool {
	ia, ib := net.ParseIP(a), net.ParseIP(b)

	return ia != nil && ib != nil && ia.Equal(ib)
}
