package checks

import (
	"context"
	"fmt"

	api "github.com/ichor-dev/kubectl-ichor/pkg/api/v1alpha1"
	"github.com/ichor-dev/kubectl-ichor/pkg/discovery"
	"github.com/ichor-dev/kubectl-ichor/pkg/kube"
	"github.com/ichor-dev/kubectl-ichor/pkg/render"
	"github.com/ichor-dev/kubectl-ichor/pkg/stages"
	"github.com/ichor-dev/kubectl-ichor/pkg/text"
)

// Invariant judges what the cluster runs now against the upgrade's invariant (no
// controller-manager, scheduler, kube-proxy or kubelet newer than the oldest apiserver),
// held nodes included: an apiserver whose version cannot be read refuses, as the upgrade
// would pause on it; skew already there is a warning, since no apply makes it worse
// and the upgrade, apiservers first, may fix it.
type Invariant struct{}

// Name implements Check.
func (Invariant) Name() string { return "invariant" }

// Run implements Check.
func (Invariant) Run(_ context.Context, in *Input) api.Check {
	inv := stages.JudgeInvariant(runningOf(in.Snapshot))

	behind := heldBehind(in)

	switch {
	case len(inv.Unknown) > 0:
		return refused("apiserver version unknown: "+text.Summarize(inv.UnknownLines()), stages.UnknownAction(inv))
	case inv.Oldest == nil:
		return ok("no apiserver seen")
	case len(behind) > 0:
		detail := fmt.Sprintf("held control plane %s keeps its kube-apiserver behind %s: the upgrade stops before the ControlPlaneComponents stage "+
			"(no controller-manager or scheduler newer than an apiserver)", text.SummarizeList(behind), in.Target)
		if len(inv.Skew) > 0 {
			detail += "; skew already there: " + text.Summarize(inv.SkewLines())
		}

		return warn(detail, stages.HeldBehindAction(behind[0]))
	case len(inv.Skew) > 0:
		return warn("skew already there: "+text.Summarize(inv.SkewLines()),
			"none needed: the upgrade keeps it from growing and moves the apiservers first; it ends when every apiserver is at least that version")
	}

	return ok(fmt.Sprintf("nothing newer than the oldest apiserver (%s on %s)", inv.At.Version, inv.At.Node))
}

// heldBehind returns the held control planes whose apiserver runs older than the target:
// the upgrade cannot move a controller-manager or scheduler past them.
func heldBehind(in *Input) []string {
	var out []string

	for _, n := range in.Snapshot.Nodes {
		sp, found := n.StaticPods[discovery.APIServer]
		if !n.Held || !n.ControlPlane || !found {
			continue
		}

		if v, err := stages.ParseVersion(render.TagOf(sp.Image)); err == nil && v.Compare(in.Target) < 0 {
			out = append(out, n.Name)
		}
	}

	return out
}

// runningOf is what a snapshot says the cluster runs: every Node's kubelet, the control
// planes' mirror pods (an apiserver without one counts as unknown) and the kube-proxy
// DaemonSet.
func runningOf(snap *discovery.Snapshot) []kube.Running {
	var out []kube.Running

	for _, n := range snap.Nodes {
		out = append(out, kube.Running{Node: n.Name, Component: discovery.Kubelet, Version: n.KubeletVersion, Source: "Node " + n.Name})

		for _, c := range discovery.StaticPodComponents() {
			sp, found := n.StaticPods[c]

			switch {
			case found:
				out = append(out, kube.Running{
					Node: n.Name, Component: c, Version: render.TagOf(sp.Image), Image: sp.Image,
					Source: "pod " + discovery.StaticPodNamespace + "/" + sp.Name,
				})
			case c == discovery.APIServer && n.ControlPlane:
				out = append(out, kube.Running{
					Node: n.Name, Component: c,
					Source: fmt.Sprintf("no %s mirror pod in %s on control plane %s", c, discovery.StaticPodNamespace, n.Name),
				})
			}
		}
	}

	if snap.KubeProxy.Present {
		out = append(out, kube.Running{
			Node: "every node", Component: discovery.KubeProxy, Version: render.TagOf(snap.KubeProxy.Image), Image: snap.KubeProxy.Image,
			Source: "DaemonSet " + discovery.StaticPodNamespace + "/" + discovery.KubeProxyDaemonSet,
		})
	}

	return out
}
