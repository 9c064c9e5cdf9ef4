package checks

import (
	"context"
	"fmt"

	api "github.com/ichor-dev/kubectl-ichor/pkg/api/v1alpha1"
	"github.com/ichor-dev/kubectl-ichor/pkg/discovery"
	"github.com/ichor-dev/kubectl-ichor/pkg/text"
)

// KubeProxyRollout warns when NotReady nodes will keep the KubeProxy stage's rollout of
// the kube-proxy DaemonSet from finishing. The DaemonSet runs a pod on every node, and
// Talos rolls it one pod at a time (maxUnavailable 1): the pod of a NotReady node cannot
// become Ready, so it takes one of the unavailable slots for as long as the node is down,
// and with none left the rollout replaces no other pod. A node the plan holds because it
// is NotReady does exactly that; the stage then pauses on it (kube.DaemonSetBlocked).
type KubeProxyRollout struct{}

// Name implements Check.
func (KubeProxyRollout) Name() string { return "kube-proxy rollout" }

// Run implements Check.
func (KubeProxyRollout) Run(_ context.Context, in *Input) api.Check {
	kp := in.Snapshot.KubeProxy
	if !kp.Present {
		return ok("kube-proxy disabled: no rollout")
	}

	var down []discovery.Node

	for _, n := range in.Snapshot.Nodes {
		if !n.Ready {
			down = append(down, n)
		}
	}

	if len(down) == 0 {
		return ok(fmt.Sprintf("every node Ready: the DaemonSet replaces %d pod(s) at a time", kp.MaxUnavailable))
	}

	what := fmt.Sprintf("its kube-proxy pod cannot become Ready and takes 1 of the DaemonSet's %d unavailable slot(s) (maxUnavailable)", kp.MaxUnavailable)
	if len(down) > 1 {
		what = fmt.Sprintf("their kube-proxy pods cannot become Ready and take %d of the DaemonSet's %d unavailable slot(s) (maxUnavailable)", len(down), kp.MaxUnavailable)
	}

	outcome := "the rollout cannot finish while it is down"
	if len(down) >= kp.MaxUnavailable {
		outcome = "no other pod can be replaced"
	}

	list := make([]string, 0, len(down))
	for _, n := range down {
		if n.Held {
			list = append(list, n.Name+" (held)")
		} else {
			list = append(list, n.Name)
		}
	}

	return warn(fmt.Sprintf("%s NotReady: %s, so %s: the KubeProxy stage pauses at its rollout", text.SummarizeList(list), what, outcome),
		fmt.Sprintf("bring %s back (Ready) before the upgrade or, if it is gone for good, delete its Node (kubectl delete node %s): its kube-proxy pod goes with it",
			names(down), down[0].Name))
}
