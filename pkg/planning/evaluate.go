package planning

import (
	"context"
	"fmt"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	api "github.com/ichor-dev/kubectl-ichor/pkg/api/v1alpha1"
	"github.com/ichor-dev/kubectl-ichor/pkg/checks"
	"github.com/ichor-dev/kubectl-ichor/pkg/discovery"
	"github.com/ichor-dev/kubectl-ichor/pkg/kube"
	"github.com/ichor-dev/kubectl-ichor/pkg/stages"
)

// Checking is what Evaluate checks a plan with.
type Checking struct {
	// Target is the plan's target version.
	Target stages.Version
	// Namespace is the product's namespace (its Job, state and credentials).
	Namespace string
	// AllowEtcdOutage accepts a control plane's reboot stopping a one- or two-member etcd.
	AllowEtcdOutage bool
	// DryRunManifests dry-runs the bootstrap manifests at the target (a Kubernetes plan).
	DryRunManifests bool
	// ManifestsForce are the manifest objects the sync takes over (--manifests-force).
	ManifestsForce []string
	// Checks are the checks to run.
	Checks []checks.Check
}

// Evaluate previews plan's drains and runs its checks, setting plan.Drains,
// plan.Checks and plan.Runnable.
func Evaluate(ctx context.Context, c Clients, cl *Cluster, plan *api.Plan, ch Checking) error {
	d := &discovery.Discoverer{Kube: c.Kube, Endpoint: c.Endpoint}

	workloads, err := d.Workloads(ctx)
	if err != nil {
		return err
	}

	plan.Drains = checks.PreviewDrains(ctx, cl.Snapshot, workloads, plan)
	plan.Checks = checks.Run(ctx, ch.Checks, &checks.Input{
		Snapshot:        cl.Snapshot,
		Target:          ch.Target,
		Namespace:       ch.Namespace,
		Metrics:         c.Metrics,
		Drains:          plan.Drains,
		Etcd:            cl.Etcd,
		AllowEtcdOutage: ch.AllowEtcdOutage,
		Manifests:       manifestFindings(ctx, c, cl, ch),
	})
	plan.Runnable = !checks.Refused(plan.Checks)

	return nil
}

// manifestFindings dry-runs the manifests Read read, server-side with the operator's
// credentials, as the run will sync them: rendered for the target
// (stages.ManifestsAtTarget, as Talos re-renders them once the node runs kube-proxy at
// the target) and through the same ManifestApplier.Check with the same
// --manifests-force. nil for a Talos plan, or when none were read.
func manifestFindings(ctx context.Context, c Clients, cl *Cluster, ch Checking) *checks.ManifestFindings {
	m := cl.Manifests
	if !ch.DryRunManifests || m.Node == "" || c.Dynamic == nil {
		return nil
	}

	f := &checks.ManifestFindings{Node: m.Node, Objects: len(m.Objects), Err: m.Err}
	if f.Err != nil {
		return f
	}

	objs, err := manifestsAtTarget(cl.Snapshot, m.Node, m.Objects, ch.Target)
	if err != nil {
		f.Err = err

		return f
	}

	dry, err := kube.NewManifestApplier(c.Dynamic, c.Kube.Discovery()).Check(ctx, objs, kube.SyncOptions{Force: ch.ManifestsForce})
	f.Skipped, f.TakenOver, f.Err = dry.Skipped, dry.TakenOver, err

	return f
}

// manifestsAtTarget are the manifests of control plane node as the run will sync them to
// target: Talos' render once its config runs kube-proxy at the target.
func manifestsAtTarget(snap *discovery.Snapshot, node string, objs []*unstructured.Unstructured, target stages.Version) ([]*unstructured.Unstructured, error) {
	for _, n := range snap.Nodes {
		if n.Name == node && n.Talos != nil {
			return stages.ManifestsAtTarget(objs, n, n.Talos.Config, target)
		}
	}

	return nil, fmt.Errorf("node %q: no machine config read to render its manifests for %s", node, target)
}
