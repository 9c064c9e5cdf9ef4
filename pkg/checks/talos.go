package checks

import (
	"context"

	api "github.com/ichor-dev/kubectl-ichor/pkg/api/v1alpha1"
	"github.com/ichor-dev/kubectl-ichor/pkg/compat"
)

// UpgradePath refuses a Talos target that machinery says a node cannot upgrade to from
// what it runs, a downgrade, and a target minor this build does not know.
type UpgradePath struct{}

// Name implements Check.
func (UpgradePath) Name() string { return compat.NameTalosUpgradeable }

// Run implements Check.
func (UpgradePath) Run(_ context.Context, in *Input) api.Check {
	return compat.TalosUpgradeable(compat.FromSnapshot(in.Snapshot), compat.Version(in.Target)).Check(UpgradePath{}.Name())
}

// KubernetesSupported refuses a Talos target that does not support the Kubernetes the
// cluster runs (every kubelet and every control-plane component).
type KubernetesSupported struct{}

// Name implements Check.
func (KubernetesSupported) Name() string { return compat.NameTalosSupports }

// Run implements Check.
func (KubernetesSupported) Run(_ context.Context, in *Input) api.Check {
	return compat.TalosSupports(compat.FromSnapshot(in.Snapshot), compat.Version(in.Target)).Check(KubernetesSupported{}.Name())
}
