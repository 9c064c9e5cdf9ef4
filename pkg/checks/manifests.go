package checks

import (
	"context"
	"fmt"

	api "github.com/ichor-dev/kubectl-ichor/pkg/api/v1alpha1"
	"github.com/ichor-dev/kubectl-ichor/pkg/kube"
)

// ManifestFindings is what a server-side dry run of a control plane's bootstrap
// manifests (as Talos renders them now) found.
type ManifestFindings struct {
	// Node is the control plane they were read from; Objects how many they hold.
	Node    string
	Objects int
	// Skipped are the objects the sync would skip: fields owned by another field
	// manager that the apply would take over.
	Skipped []kube.Skipped
	// Err is why they could not be read or dry-run.
	Err error
}

// BootstrapManifests says what the KubeProxy stage's manifest sync would leave alone:
// the objects another field manager (Helm, kubectl) changed.
type BootstrapManifests struct{}

// Name implements Check.
func (BootstrapManifests) Name() string { return "bootstrap manifests" }

// Run implements Check.
func (BootstrapManifests) Run(_ context.Context, in *Input) api.Check {
	f := in.Manifests

	switch {
	case f == nil:
		return warn("not read: no control plane's manifests could be read with this talosconfig",
			"the sync skips and names the objects another field manager changed; plan with a talosconfig that reaches the control planes to see them now")
	case f.Err != nil:
		return warn(fmt.Sprintf("could not dry-run the manifests of %s: %v", f.Node, f.Err),
			"the sync dry-runs them again and pauses, naming the object, before it applies anything")
	case len(f.Skipped) > 0:
		lines := make([]string, 0, len(f.Skipped))
		for _, s := range f.Skipped {
			lines = append(lines, fmt.Sprintf("%s (%s)", s.Object, s.Conflict))
		}

		return warn(fmt.Sprintf("%d of %d object(s) of %s changed by another field manager, the sync skips them: %s",
			len(f.Skipped), f.Objects, f.Node, summarize(lines)),
			fmt.Sprintf(`nothing to do to keep them; to take them over: kubectl ichor upgrade kubernetes --manifests-force %q`, f.Skipped[0].Object))
	}

	return ok(fmt.Sprintf("%d object(s) of %s dry-run: none changed by another field manager; nothing is pruned", f.Objects, f.Node))
}
