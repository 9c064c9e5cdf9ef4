package checks

import (
	"context"
	"fmt"
	"sort"
	"strings"

	"github.com/siderolabs/talos/pkg/machinery/compatibility"

	api "github.com/ichor-dev/kubectl-ichor/pkg/api/v1alpha1"
	"github.com/ichor-dev/kubectl-ichor/pkg/stages"
	"github.com/ichor-dev/kubectl-ichor/pkg/text"
)

// UpgradePath refuses a Talos target that machinery says a node cannot upgrade to from
// what it runs, a downgrade, and a target minor this build does not know.
type UpgradePath struct{}

// Name implements Check.
func (UpgradePath) Name() string { return "upgrade path" }

// Run implements Check.
func (UpgradePath) Run(_ context.Context, in *Input) api.Check {
	target, err := talosVersion(in.Target)
	if err != nil {
		return refused(fmt.Sprintf("target %s: %v", in.Target, err), "pass --to vX.Y.Z")
	}

	if _, _, known := kubernetesRange(target); !known {
		detail, action := unknownTalos(in.Target, "")

		return refused(detail, action)
	}

	var (
		problems []string
		from     = map[string]int{}
	)

	for _, n := range active(in.Snapshot) {
		if n.Talos == nil {
			continue
		}

		v, err := stages.ParseVersion(n.Talos.Version)
		if err != nil {
			problems = append(problems, fmt.Sprintf("%s: Talos version: %v", n.Name, err))

			continue
		}

		if v.Compare(in.Target) > 0 {
			problems = append(problems, fmt.Sprintf("%s: %s is older than the running %s: downgrades are not supported", n.Name, in.Target, v))

			continue
		}

		host, err := talosVersion(v)
		if err != nil {
			problems = append(problems, fmt.Sprintf("%s: %v", n.Name, err))

			continue
		}

		if err := target.UpgradeableFrom(host); err != nil {
			problems = append(problems, fmt.Sprintf("%s: %v", n.Name, err))

			continue
		}

		if v != in.Target {
			from[v.String()]++
		}
	}

	if len(problems) > 0 {
		return refused(text.Summarize(problems), "upgrade through an intermediate Talos release first (see the Talos upgrade notes)")
	}

	if len(from) == 0 {
		return ok(fmt.Sprintf("every node runs %s", in.Target))
	}

	versions := make([]string, 0, len(from))
	for v := range from {
		versions = append(versions, v)
	}

	sort.Strings(versions)

	return ok(fmt.Sprintf("%s -> %s supported by machinery's upgrade table", strings.Join(versions, ", "), in.Target))
}

// KubernetesSupported refuses a Talos target that does not support the Kubernetes the
// cluster runs (every kubelet and every control-plane component).
type KubernetesSupported struct{}

// Name implements Check.
func (KubernetesSupported) Name() string { return "kubernetes on target" }

// Run implements Check.
func (KubernetesSupported) Run(_ context.Context, in *Input) api.Check {
	target, err := talosVersion(in.Target)
	if err != nil {
		return refused(fmt.Sprintf("target %s: %v", in.Target, err), "pass --to vX.Y.Z")
	}

	lo, hi, known := kubernetesRange(target)
	if !known {
		detail, action := unknownTalos(in.Target, "")

		return refused(detail, action)
	}

	var problems []string

	seen := map[string]bool{}

	for _, n := range active(in.Snapshot) {
		for _, rv := range runningVersions(n) {
			if seen[rv.version] {
				continue
			}

			seen[rv.version] = true

			kv, err := compatibility.ParseKubernetesVersion(rv.version)
			if err != nil {
				problems = append(problems, fmt.Sprintf("%s %s: version %q: %v", n.Name, rv.component, rv.version, err))

				continue
			}

			if err := kv.SupportedWith(target); err != nil {
				problems = append(problems, fmt.Sprintf("Kubernetes %s (%s on %s) is outside 1.%d-1.%d", rv.version, rv.component, n.Name, lo, hi))
			}
		}
	}

	if len(problems) > 0 {
		return refused(fmt.Sprintf("Talos %s supports Kubernetes 1.%d-1.%d: %s", in.Target, lo, hi, text.Summarize(problems)),
			"move Kubernetes into that range first (kubectl ichor plan kubernetes --to ...)")
	}

	return ok(fmt.Sprintf("Talos %s supports Kubernetes 1.%d-1.%d", in.Target, lo, hi))
}
