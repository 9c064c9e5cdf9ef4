package checks

import (
	"context"

	api "github.com/ichor-dev/kubectl-ichor/pkg/api/v1alpha1"
	"github.com/ichor-dev/kubectl-ichor/pkg/discovery"
	"github.com/ichor-dev/kubectl-ichor/pkg/stages"
	"github.com/ichor-dev/kubectl-ichor/pkg/text"
)

// MetricsReader reads the Kubernetes API server's /metrics in the Prometheus text format.
type MetricsReader interface {
	// Metrics returns the body of GET /metrics.
	Metrics(ctx context.Context) ([]byte, error)
}

// Input is what the checks read.
type Input struct {
	// Snapshot is the cluster as discovered.
	Snapshot *discovery.Snapshot
	// Target is the version asked for (Kubernetes or Talos, by the plan's kind).
	Target stages.Version
	// Namespace is the product's namespace, where the Job runs.
	Namespace string
	// Metrics reads the apiserver's metrics; nil means the removed-APIs check cannot run.
	Metrics MetricsReader
	// Drains is the plan's drain preview (PreviewDrains).
	Drains []api.NodeDrain
	// Manifests is the dry run of a control plane's bootstrap manifests; nil when they
	// were not read.
	Manifests *ManifestFindings
	// Etcd is etcd as the control planes' Talos APIs described it (a Talos plan); nil
	// when it was not read.
	Etcd *stages.EtcdView
	// AllowEtcdOutage is --allow-etcd-outage: a control plane's reboot may stop a one-
	// or two-member etcd.
	AllowEtcdOutage bool
}

// Check is one pre-flight check.
type Check interface {
	// Name is the check's short name, as the CHECK column shows it.
	Name() string
	// Run returns the check's result.
	Run(ctx context.Context, in *Input) api.Check
}

// Kubernetes returns the checks of a Kubernetes upgrade, in the order they are shown.
func Kubernetes() []Check {
	return []Check{
		VersionSkew{}, Invariant{}, TalosPairing{}, NodesReady{}, NotTalos{}, RemovedAPIs{}, Endpoint{},
		Drains{}, HeldNodes{}, KubeProxyRollout{}, BootstrapManifests{}, TalosAccess{}, RunnerNode{},
	}
}

// Talos returns the checks of a Talos OS upgrade, in the order they are shown.
func Talos() []Check {
	return []Check{
		UpgradePath{}, KubernetesSupported{}, NodesReady{}, NotTalos{}, StagedConfig{}, EtcdQuorum{}, KernelArgs{}, Drains{}, HeldNodes{}, TalosAccess{}, RunnerNode{},
	}
}

// Run runs every check in order.
func Run(ctx context.Context, checks []Check, in *Input) []api.Check {
	out := make([]api.Check, 0, len(checks))

	for _, c := range checks {
		r := c.Run(ctx, in)
		r.Name = c.Name()
		out = append(out, r)
	}

	return out
}

// Refused reports whether any result is REFUSED.
func Refused(results []api.Check) bool {
	for _, r := range results {
		if r.Result == api.ResultRefused {
			return true
		}
	}

	return false
}

func ok(detail string) api.Check { return api.Check{Result: api.ResultOK, Detail: detail} }

func warn(detail, action string) api.Check {
	return api.Check{Result: api.ResultWarn, Detail: detail, Action: action}
}

func refused(detail, action string) api.Check {
	return api.Check{Result: api.ResultRefused, Detail: detail, Action: action}
}

// active returns the nodes an upgrade visits: every node not held.
func active(snap *discovery.Snapshot) []discovery.Node {
	var out []discovery.Node

	for _, n := range snap.Nodes {
		if !n.Held {
			out = append(out, n)
		}
	}

	return out
}

// names joins node names, at most a few.
func names(nodes []discovery.Node) string {
	list := make([]string, 0, len(nodes))
	for _, n := range nodes {
		list = append(list, n.Name)
	}

	return text.SummarizeList(list)
}
