package checks

import (
	"context"
	"fmt"
	"time"

	api "github.com/ichor-dev/kubectl-ichor/pkg/api/v1alpha1"
	"github.com/ichor-dev/kubectl-ichor/pkg/discovery"
	"github.com/ichor-dev/kubectl-ichor/pkg/kube"
	"github.com/ichor-dev/kubectl-ichor/pkg/text"
)

// NodesReady refuses when a node the upgrade visits is not Ready, and warns about cordoned
// ones (the upgrade uncordons the nodes it drains). Nodes still starting (their kubelet
// posts NotReady, for less than kube.StartingWindow: a node back from a boot) are a
// warning when they are all the NotReady ones: the upgrade waits for them at its stage's
// checks, and refuses them only if they are not Ready by then.
type NodesReady struct{}

// Name implements Check.
func (NodesReady) Name() string { return "nodes ready" }

// Run implements Check.
func (NodesReady) Run(_ context.Context, in *Input) api.Check {
	nodes := active(in.Snapshot)

	var notReady, starting, cordoned []discovery.Node

	for _, n := range nodes {
		if !n.Ready {
			notReady = append(notReady, n)

			if !n.NotReadySince.IsZero() && time.Since(n.NotReadySince) < kube.StartingWindow {
				starting = append(starting, n)
			}
		}

		if n.Unschedulable {
			cordoned = append(cordoned, n)
		}
	}

	ready := fmt.Sprintf("%d/%d", len(nodes)-len(notReady), len(nodes))

	switch {
	case len(notReady) > 0 && len(starting) == len(notReady):
		return warn(fmt.Sprintf("%s Ready; starting: %s (NotReady since %s); the upgrade waits for each to come Ready, up to %s after it turned NotReady",
			ready, names(starting), starting[0].NotReadySince.UTC().Format(time.TimeOnly+" UTC"), kube.StartingWindow),
			fmt.Sprintf("none if it comes Ready; if not, fix it or hold it: kubectl annotate node %s %s=<reason>", starting[0].Name, discovery.HoldAnnotation))
	case len(notReady) > 0:
		return refused(fmt.Sprintf("%s Ready; not Ready: %s", ready, names(notReady)),
			fmt.Sprintf("fix them, or hold them: kubectl annotate node %s %s=<reason>", notReady[0].Name, discovery.HoldAnnotation))
	case len(cordoned) > 0:
		return warn(fmt.Sprintf("%s Ready; cordoned: %s (uncordoned once upgraded)", ready, names(cordoned)),
			fmt.Sprintf("hold them to keep them cordoned: kubectl annotate node %s %s=<reason>", cordoned[0].Name, discovery.HoldAnnotation))
	}

	return ok(ready)
}

// NotTalos refuses nodes whose OS is not Talos (held ones excepted).
type NotTalos struct{}

// Name implements Check.
func (NotTalos) Name() string { return "talos nodes" }

// Run implements Check.
func (NotTalos) Run(_ context.Context, in *Input) api.Check {
	var bad []string

	for _, n := range active(in.Snapshot) {
		if !n.IsTalos() {
			bad = append(bad, fmt.Sprintf("%s runs %q", n.Name, n.OSImage))
		}
	}

	if len(bad) > 0 {
		return refused("not Talos: "+text.Summarize(bad),
			fmt.Sprintf("hold them (kubectl annotate node <node> %s=not-talos) or remove them from the cluster", discovery.HoldAnnotation))
	}

	return ok("every node runs Talos")
}

// HeldNodes shows the nodes the hold annotation excludes; they keep what they run.
type HeldNodes struct{}

// Name implements Check.
func (HeldNodes) Name() string { return "held nodes" }

// Run implements Check.
func (HeldNodes) Run(_ context.Context, in *Input) api.Check {
	var held []string

	for _, n := range in.Snapshot.Nodes {
		if n.Held {
			held = append(held, n.Name)
		}
	}

	if len(held) == 0 {
		return ok("none")
	}

	return warn(fmt.Sprintf("%s held (%s): not upgraded", text.SummarizeList(held), discovery.HoldAnnotation),
		fmt.Sprintf("remove the annotation to include them: kubectl annotate node %s %s-", held[0], discovery.HoldAnnotation))
}
