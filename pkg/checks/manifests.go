package checks

import (
	"context"
	"fmt"
	"strings"

	api "github.com/ichor-dev/kubectl-ichor/pkg/api/v1alpha1"
	"github.com/ichor-dev/kubectl-ichor/pkg/kube"
	"github.com/ichor-dev/kubectl-ichor/pkg/stages"
	"github.com/ichor-dev/kubectl-ichor/pkg/text"
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
	// TakenOver are the objects whose fields Talos' own earlier writes hold, which the
	// sync takes over.
	TakenOver []kube.TakenOver
	// Err is why they could not be read or dry-run.
	Err error
}

// BootstrapManifests says what the KubeProxy stage's manifest sync, dry-run as it will
// apply them (at the target), would leave alone: the objects another field manager (Helm,
// kubectl) changed; and what it takes over from Talos' own earlier writes. It refuses
// when the kube-proxy DaemonSet would be left alone: its rollout to the target could
// never come, and the run would pause at the KubeProxy stage after changing the control
// planes.
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
	}

	taken := takenOverText(f.TakenOver)

	for _, s := range f.Skipped {
		if s.Object != stages.KubeProxyObject {
			continue
		}

		return refused(fmt.Sprintf("%s of %s at %s: %s holds fields the sync would change (%s): the sync would skip it and kube-proxy would never reach %s",
			s.Object, f.Node, in.Target, holders(s), s.Conflict, in.Target),
			fmt.Sprintf("to let the sync take them back for Talos: kubectl ichor upgrade kubernetes --to %s --manifests-force %q; "+
				"or move that manager's change into the machine config (cluster.proxy), then plan again", in.Target, s.Object))
	}

	if len(f.Skipped) > 0 {
		lines := make([]string, 0, len(f.Skipped))
		for _, s := range f.Skipped {
			lines = append(lines, fmt.Sprintf("%s (%s)", s.Object, s.Conflict))
		}

		return warn(fmt.Sprintf("%d of %d object(s) of %s changed by another field manager, the sync skips them: %s%s",
			len(f.Skipped), f.Objects, f.Node, text.Summarize(lines), taken),
			fmt.Sprintf(`nothing to do to keep them; to take them over: kubectl ichor upgrade kubernetes --manifests-force %q`, f.Skipped[0].Object))
	}

	return ok(fmt.Sprintf("%d object(s) of %s dry-run at the target: none changed by another field manager; nothing is pruned%s", f.Objects, f.Node, taken))
}

// takenOverText says which objects the sync takes over from Talos' own earlier writes.
func takenOverText(taken []kube.TakenOver) string {
	if len(taken) == 0 {
		return ""
	}

	lines := make([]string, 0, len(taken))
	for _, t := range taken {
		from := make([]string, 0, len(t.From))
		for _, h := range t.From {
			from = append(from, h.String())
		}

		lines = append(lines, fmt.Sprintf("%s (from %s)", t.Object, strings.Join(from, ", ")))
	}

	return fmt.Sprintf("; %d held by Talos' own earlier writes, taken over: %s", len(taken), text.Summarize(lines))
}

// holders names the field managers of a skipped object.
func holders(s kube.Skipped) string {
	if len(s.Holders) == 0 {
		return "another field manager"
	}

	names := make([]string, 0, len(s.Holders))
	for _, h := range s.Holders {
		names = append(names, h.String())
	}

	return "field manager " + strings.Join(names, ", ")
}
