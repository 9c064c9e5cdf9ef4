package checks

import (
	"context"
	"fmt"
	"slices"
	"strings"

	api "github.com/ichor-dev/kubectl-ichor/pkg/api/v1alpha1"
	"github.com/ichor-dev/kubectl-ichor/pkg/discovery"
)

// JobRole is the Talos role the Job's Talos ServiceAccount asks for.
const JobRole = "os:admin"

// TalosAccess checks that the control planes' machine configs let the Job reach the Talos
// API from the product's namespace: the Talos API access from Kubernetes enabled with role
// os:admin and the namespace allowed (machine.features.kubernetesTalosAPIAccess, or Talos
// 1.14's KubeTalosAPIAccessConfig document). When not, it warns with the exact patch, in the
// form each node's config uses.
type TalosAccess struct{}

// Name implements Check.
func (TalosAccess) Name() string { return "talos access for job" }

// Run implements Check.
func (TalosAccess) Run(_ context.Context, in *Input) api.Check {
	var (
		read int
		// missing holds the nodes to patch, by the form of the patch: the
		// document (true) or the v1alpha1 feature (false).
		missing = map[bool][]discovery.Node{}
		first   = map[bool]discovery.TalosAPIAccess{}
	)

	for _, n := range in.Snapshot.ControlPlanes() {
		if n.Held || n.Talos == nil {
			continue
		}

		read++

		a := n.Talos.APIAccess
		if a.Enabled && slices.Contains(a.AllowedRoles, JobRole) && slices.Contains(a.AllowedNamespaces, in.Namespace) {
			continue
		}

		if len(missing[a.Document]) == 0 {
			first[a.Document] = a
		}

		missing[a.Document] = append(missing[a.Document], n)
	}

	if read == 0 {
		return warn("no control plane's Talos machine config could be read, so the Talos API access the Job needs is unknown",
			"check that the control planes are Talos nodes reachable with your talosconfig (talosctl -n <ip> version), "+
				"or let the upgrade copy your talosconfig: --talos-credentials=local")
	}

	if len(missing) == 0 {
		return ok(fmt.Sprintf("Talos API access from Kubernetes allows %s in %s", JobRole, in.Namespace))
	}

	var (
		all     []discovery.Node
		actions []string
	)

	for _, document := range []bool{false, true} {
		nodes := missing[document]
		if len(nodes) == 0 {
			continue
		}

		all = append(all, nodes...)

		ips := make([]string, 0, len(nodes))
		for _, n := range nodes {
			ips = append(ips, n.InternalIP)
		}

		file := "ichor-talos-access.yaml"
		if len(missing) > 1 && document {
			file = "ichor-talos-access-doc.yaml"
		}

		actions = append(actions, fmt.Sprintf("patch %s (talosctl patch mc --nodes %s --patch @%s) with:\n%s",
			names(nodes), strings.Join(ips, ","), file, AccessPatch(first[document], in.Namespace)))
	}

	return warn(fmt.Sprintf("Talos API access from Kubernetes on %s does not allow %s in %s", names(all), JobRole, in.Namespace),
		strings.Join(actions, "")+"or let the upgrade copy your talosconfig: --talos-credentials=local")
}

// AccessPatch is the machine config patch that adds role os:admin and namespace ns to the
// existing Talos API access settings, keeping what they already allow: a
// KubeTalosAPIAccessConfig document when current is in that form (Talos 1.14 configs),
// machine.features.kubernetesTalosAPIAccess otherwise.
func AccessPatch(current discovery.TalosAPIAccess, ns string) string {
	roles := appendMissing(current.AllowedRoles, JobRole)
	namespaces := appendMissing(current.AllowedNamespaces, ns)

	var (
		b      strings.Builder
		indent string
	)

	if current.Document {
		b.WriteString("apiVersion: v1alpha1\nkind: KubeTalosAPIAccessConfig\nallowedRoles:\n")
	} else {
		indent = "      "
		b.WriteString("machine:\n  features:\n    kubernetesTalosAPIAccess:\n      enabled: true\n      allowedRoles:\n")
	}

	for _, r := range roles {
		fmt.Fprintf(&b, "%s  - %s\n", indent, r)
	}

	fmt.Fprintf(&b, "%sallowedKubernetesNamespaces:\n", indent)

	for _, n := range namespaces {
		fmt.Fprintf(&b, "%s  - %s\n", indent, n)
	}

	return b.String()
}

func appendMissing(list []string, item string) []string {
	out := slices.Clone(list)
	if !slices.Contains(out, item) {
		out = append(out, item)
	}

	return out
}
