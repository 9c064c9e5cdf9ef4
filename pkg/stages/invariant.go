package stages

import (
	"fmt"

	"github.com/ichor-dev/kubectl-ichor/pkg/discovery"
	"github.com/ichor-dev/kubectl-ichor/pkg/kube"
)

// Invariant is what the cluster runs judged against the upgrade's invariant: no
// controller-manager, scheduler, kube-proxy or kubelet newer than the oldest apiserver.
type Invariant struct {
	// Oldest is the oldest apiserver's version, At where it runs; nil when no apiserver
	// version was read.
	Oldest *Version
	At     kube.Running
	// Unknown are the apiservers whose version cannot be read (a digest-only or suffixed
	// tag, or a control plane without a mirror pod): the invariant cannot be judged, and
	// an upgrade does not go on blind.
	Unknown []kube.Running
	// Skew are the components newer than the oldest apiserver.
	Skew []Skewed
}

// Skewed is a component newer than the oldest apiserver.
type Skewed struct {
	kube.Running
	// Parsed is its version.
	Parsed Version
}

// JudgeInvariant judges what running says the cluster runs.
func JudgeInvariant(running []kube.Running) Invariant {
	var inv Invariant

	for _, run := range running {
		if run.Component != discovery.APIServer {
			continue
		}

		v, err := ParseVersion(run.Version)
		if err != nil {
			inv.Unknown = append(inv.Unknown, run)

			continue
		}

		if inv.Oldest == nil || v.Compare(*inv.Oldest) < 0 {
			inv.Oldest, inv.At = &v, run
		}
	}

	if inv.Oldest == nil {
		return inv
	}

	for _, run := range running {
		switch run.Component {
		case discovery.ControllerManager, discovery.Scheduler, discovery.KubeProxy, discovery.Kubelet:
		default:
			continue
		}

		v, err := ParseVersion(run.Version)
		if err != nil || v.Compare(*inv.Oldest) <= 0 {
			continue
		}

		inv.Skew = append(inv.Skew, Skewed{Running: run, Parsed: v})
	}

	return inv
}

// SkewLines says every skewed component, one line each.
func (inv Invariant) SkewLines() []string {
	out := make([]string, 0, len(inv.Skew))
	for _, s := range inv.Skew {
		out = append(out, inv.skewLine(s))
	}

	return out
}

func (inv Invariant) skewLine(s Skewed) string {
	return fmt.Sprintf("%s %s on %s (%s) is newer than %s %s on %s",
		s.Component, s.Version, s.Node, s.Source, inv.At.Component, inv.At.Version, inv.At.Node)
}

// UnknownLines says every apiserver whose version cannot be read, one line each.
func (inv Invariant) UnknownLines() []string {
	out := make([]string, 0, len(inv.Unknown))

	for _, u := range inv.Unknown {
		if u.Image != "" {
			out = append(out, fmt.Sprintf("%s on %s: image %q has no vMAJOR.MINOR.PATCH tag (%s)", u.Component, u.Node, u.Image, u.Source))

			continue
		}

		if u.Version == "" {
			out = append(out, fmt.Sprintf("%s on %s: no version (%s)", u.Component, u.Node, u.Source))

			continue
		}

		out = append(out, fmt.Sprintf("%s on %s: version %q (%s) is not vMAJOR.MINOR.PATCH", u.Component, u.Node, u.Version, u.Source))
	}

	return out
}

// UnknownAction says what to do about apiservers whose version cannot be read.
func UnknownAction(inv Invariant) string {
	node := "<node>"
	if len(inv.Unknown) > 0 {
		node = inv.Unknown[0].Node
	}

	if len(inv.Unknown) > 0 && inv.Unknown[0].Image == "" && inv.Unknown[0].Version == "" {
		return fmt.Sprintf("kube-apiserver on %s has no mirror pod: a kubelet that just restarted recreates it within seconds; "+
			"if it does not show (kubectl -n %s get pods -l %s=%s -o wide), check the kubelet (talosctl -n <its address> service kubelet), then resume",
			node, discovery.StaticPodNamespace, discovery.ComponentLabel, discovery.APIServer)
	}

	return fmt.Sprintf("the invariant needs every apiserver's version: give kube-apiserver on %s an image tagged vMAJOR.MINOR.PATCH "+
		"(cluster.apiServer.image in its machine config; not digest-only, no suffix) and make sure its mirror pod shows "+
		"(kubectl -n %s get pods -l %s=%s -o wide), then resume",
		node, discovery.StaticPodNamespace, discovery.ComponentLabel, discovery.APIServer)
}

// HeldBehindAction says what to do about held control plane node, whose kube-apiserver
// stays behind the target: the plan warns with it, and the engine pauses with it before
// the ControlPlaneComponents stage would move a controller-manager past that apiserver.
func HeldBehindAction(node string) string {
	return fmt.Sprintf("remove the hold before, or when the upgrade pauses there (kubectl annotate node %s %s-), then resume", node, discovery.HoldAnnotation)
}

// UnreadableAction says what to do about a component of node whose image in the
// machine config has no version to judge the step from.
func UnreadableAction(node string) string {
	return fmt.Sprintf("a step is judged from the version the image's tag says: give the component on %s an image tagged vMAJOR.MINOR.PATCH "+
		"in its machine config (not digest-only, no suffix; talosctl -n <its address> edit machineconfig), then resume", node)
}

// WorseThan returns a line for every way after breaks the invariant more than before:
// a component skewed in after that was not in before, or is newer than it was, and
// every skew when the oldest apiserver went back. Skew that before already had and that
// did not grow is not counted: no apply makes the invariant worse, so the upgrade that
// fixes pre-existing skew (the apiservers forward) can run.
func (inv Invariant) WorseThan(before Invariant) []string {
	was := map[string]Version{}
	for _, s := range before.Skew {
		was[s.Node+"/"+string(s.Component)] = s.Parsed
	}

	back := before.Oldest != nil && inv.Oldest != nil && inv.Oldest.Compare(*before.Oldest) < 0

	var out []string

	for _, s := range inv.Skew {
		v, ok := was[s.Node+"/"+string(s.Component)]
		if back || !ok || s.Parsed.Compare(v) > 0 {
			out = append(out, inv.skewLine(s))
		}
	}

	return out
}
