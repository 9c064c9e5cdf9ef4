package engine

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/ichor-dev/kubectl-ichor/pkg/discovery"
)

// This file lends the fakes to package engine_test, whose tests also run pkg/checks
// (which imports the engine through pkg/job, so package engine cannot).

// FakeSpec is a fake cluster's shape: every component at Kubernetes, every node on
// Talos, the nodes named in Held held.
type FakeSpec struct {
	ControlPlanes, Workers int
	Kubernetes, Talos      string
	Held                   []string
}

// RunFake builds the fake cluster of spec, runs an upgrade of kind (KindKubernetes or
// KindTalos) to target on it, and returns the cluster as a plan discovers it (the Talos
// side read) before the run, and the run's error.
func RunFake(t *testing.T, kind Kind, spec FakeSpec, target string) (*discovery.Snapshot, error) {
	t.Helper()

	ctx := context.Background()
	cs := clusterSpec{controlPlanes: spec.ControlPlanes, workers: spec.Workers, kubernetes: spec.Kubernetes, talos: spec.Talos}

	var (
		f      *fakeCluster
		o      *fakeOS
		reader discovery.TalosReader
	)

	if kind == KindTalos {
		o = newFakeOS(t, cs)
		f, reader = o.f, o
	} else {
		f = newFakeCluster(t, cs)
		reader = (*fakeTalos)(f)
	}

	for _, n := range spec.Held {
		setHold(t, f, n, "RMA")
	}

	snap, err := (&discovery.Discoverer{Kube: f.cs, Talos: reader}).Discover(ctx)
	require.NoError(t, err)

	if kind == KindTalos {
		return snap, o.engine(target, newMemo()).Run(ctx)
	}

	return snap, f.engine(target).Run(ctx)
}
