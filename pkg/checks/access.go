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
// API from the product's namespace: machine.features.kubernetesTalosAPIAccess enabled with
// role os:admin and the namespace allowed. When not, it warns with the exact patch.
type TalosAccess struct{}

// Name implements Check.
func (TalosAccess) Name() string { return "talos access for job" }

// Run implements Check.
func (TalosAccess) Run(_ context.Context, in *Input) api.Check {
	var (
		missing []discovery.Node
		first   discovery.TalosAPIAccess
	)

	for _, n := range in.Snapshot.ControlPlanes() {
		if n.Held || n.Talos == nil {
			continue
		}

		a := n.Talos.APIAccess
		if a.Enabled && slices.Contains(a.AllowedRoles, JobRole) && slices.Contains(a.AllowedNamespaces, in.Namespace) {
			continue
		}

		if len(missing) == 0 {
			first = a
		}

		missing = append(missing, n)
	}

	if len(missing) == 0 {
		return ok(fmt.Sprintf("kubernetesTalosAPIAccess allows %s in %s", JobRole, in.Namespace))
	}

	ips := make([]string, 0, len(missing))
	for _, n := range missing {
		ips = append(ips, n.InternalIP)
	}

	return warn(fmt.Sprintf("kubernetesTalosAPIAccess on %s does not allow %s in %s", names(missing), JobRole, in.Namespace),
		fmt.Sprintf("patch the control planes (talosctl patch mc --nodes %s --patch @ichor-talos-access.yaml) with:\n%s"+
			"or let the upgrade copy your talosconfig: --talos-credentials=local",
			strings.Join(ips, ","), AccessPatch(first, in.Namespace)))
}

// AccessPatch is the machine config patch that adds role os:admin and namespace ns to the
// existing kubernetesTalosAPIAccess settings, keeping what they already allow.
func AccessPatch(current discovery.TalosAPIAccess, ns string) string {
	roles := appendMissing(current.AllowedRoles, JobRole)
	namespaces := appendMissing(current.AllowedNamespaces, ns)

	var b strings.Builder

	b.WriteString("machine:\n  features:\n    kubernetesTalosAPIAccess:\n      enabled: true\n      allowedRoles:\n")

	for _, r := range roles {
		fmt.Fprintf(&b, "        - %s\n", r)
	}

	b.WriteString("      allowedKubernetesNamespaces:\n")

	for _, n := range namespaces {
		fmt.Fprintf(&b, "        - %s\n", n)
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
