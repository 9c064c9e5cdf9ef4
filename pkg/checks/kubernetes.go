package checks

import (
	"context"
	"fmt"
	"net"
	"net/url"
	"sort"
	"strings"

	"github.com/siderolabs/talos/pkg/machinery/compatibility"

	api "github.com/ichor-dev/kubectl-ichor/pkg/api/v1alpha1"
	"github.com/ichor-dev/kubectl-ichor/pkg/discovery"
	"github.com/ichor-dev/kubectl-ichor/pkg/render"
	"github.com/ichor-dev/kubectl-ichor/pkg/stages"
	"github.com/ichor-dev/kubectl-ichor/pkg/text"
)

// VersionSkew refuses a target that is a downgrade or skips a minor for any component any
// node runs, judged per node against what it runs (kubelet, machine config, mirror pods).
type VersionSkew struct{}

// Name implements Check.
func (VersionSkew) Name() string { return "version skew" }

// Run implements Check.
func (VersionSkew) Run(_ context.Context, in *Input) api.Check {
	var (
		oldest *stages.Version
		// The same problem on many nodes is said once, naming the nodes.
		problems []string
		nodesOf  = map[string][]string{}
		compsOf  = map[string]map[string]bool{}
	)

	note := func(problem, component, node string) {
		if _, seen := nodesOf[problem]; !seen {
			problems = append(problems, problem)
			compsOf[problem] = map[string]bool{}
		}

		if l := nodesOf[problem]; len(l) == 0 || l[len(l)-1] != node {
			nodesOf[problem] = append(l, node)
		}

		compsOf[problem][component] = true
	}

	for _, n := range active(in.Snapshot) {
		for _, rv := range runningVersions(n) {
			v, err := stages.ParseVersion(rv.version)
			if err != nil {
				note(err.Error(), rv.component, n.Name)

				continue
			}

			if oldest == nil || v.Compare(*oldest) < 0 {
				oldest = &v
			}

			if err := stages.CheckStep(v, in.Target); err != nil {
				note(err.Error(), rv.component, n.Name)
			}
		}
	}

	if len(problems) > 0 {
		lines := make([]string, 0, len(problems))
		for _, p := range problems {
			where := "on " + text.SummarizeList(nodesOf[p])
			if len(compsOf[p]) <= 3 {
				comps := make([]string, 0, len(compsOf[p]))
				for c := range compsOf[p] {
					comps = append(comps, c)
				}

				sort.Strings(comps)
				where = strings.Join(comps, ", ") + " " + where
			}

			lines = append(lines, fmt.Sprintf("%s (%s)", p, where))
		}

		return refused(text.Summarize(lines), "choose a target one minor at most above what every node runs, or hold the nodes behind")
	}

	switch {
	case oldest == nil:
		return ok("no node to upgrade")
	case oldest.SameMinor(in.Target):
		return ok(fmt.Sprintf("patch upgrade within %s", in.Target.MinorString()))
	default:
		return ok(fmt.Sprintf("one minor (%s -> %s), no node behind", oldest.MinorString(), in.Target.MinorString()))
	}
}

type runningVersion struct {
	component string
	version   string
}

// runningVersions is every version a node runs: its kubelet, each image of its machine
// config and each mirror pod.
func runningVersions(n discovery.Node) []runningVersion {
	out := []runningVersion{{component: string(discovery.Kubelet), version: n.KubeletVersion}}

	for _, c := range discovery.Components() {
		if n.Talos != nil {
			if image, found := n.Talos.Images[c]; found && c != discovery.Kubelet {
				out = append(out, runningVersion{component: string(c), version: render.TagOf(image)})
			}
		}

		if sp, found := n.StaticPods[c]; found {
			out = append(out, runningVersion{component: string(c) + " pod", version: render.TagOf(sp.Image)})
		}
	}

	return out
}

// TalosPairing refuses a Kubernetes target that a node's Talos does not support, and a
// Talos minor this build does not know.
type TalosPairing struct{}

// Name implements Check.
func (TalosPairing) Name() string { return "talos pairing" }

// Run implements Check.
func (TalosPairing) Run(_ context.Context, in *Input) api.Check {
	kv, err := compatibility.ParseKubernetesVersion(in.Target.String())
	if err != nil {
		return refused(fmt.Sprintf("target %s: %v", in.Target, err), "pass --to vX.Y.Z")
	}

	byVersion := map[string][]discovery.Node{}

	for _, n := range active(in.Snapshot) {
		if n.Talos != nil {
			byVersion[n.Talos.Version] = append(byVersion[n.Talos.Version], n)
		}
	}

	if len(byVersion) == 0 {
		return ok("no Talos node to pair")
	}

	versions := make([]string, 0, len(byVersion))
	for v := range byVersion {
		versions = append(versions, v)
	}

	sort.Strings(versions)

	var details []string

	for _, raw := range versions {
		nodes := byVersion[raw]

		v, err := stages.ParseVersion(raw)
		if err != nil {
			return refused(fmt.Sprintf("Talos version on %s: %v", names(nodes), err), "check the nodes' Talos version (talosctl version)")
		}

		tv, err := talosVersion(v)
		if err != nil {
			return refused(fmt.Sprintf("Talos %s on %s: %v", raw, names(nodes), err), "check the nodes' Talos version (talosctl version)")
		}

		lo, hi, known := kubernetesRange(tv)
		if !known {
			detail, action := unknownTalos(v, " (on "+names(nodes)+")")

			return refused(detail, action)
		}

		if err := kv.SupportedWith(tv); err != nil {
			return refused(fmt.Sprintf("Talos %s (on %s) supports Kubernetes 1.%d-1.%d, not %s", raw, names(nodes), lo, hi, in.Target),
				talosFor(kv))
		}

		details = append(details, fmt.Sprintf("Talos %s supports Kubernetes 1.%d-1.%d", raw, lo, hi))
	}

	return ok(strings.Join(details, "; "))
}

// Endpoint warns when a minor upgrade of several control planes goes through an endpoint
// that is a single control plane: the API is gone while that node's apiserver restarts.
type Endpoint struct{}

// Name implements Check.
func (Endpoint) Name() string { return "endpoint" }

// Run implements Check.
func (Endpoint) Run(_ context.Context, in *Input) api.Check {
	cps := in.Snapshot.ControlPlanes()
	if len(cps) < 2 {
		return ok(fmt.Sprintf("%d control plane: the API is unreachable while its apiserver restarts, whatever the endpoint", len(cps)))
	}

	minor := false

	for _, n := range cps {
		if v, err := stages.ParseVersion(n.KubeletVersion); err == nil && !v.SameMinor(in.Target) {
			minor = true
		}

		if sp, found := n.StaticPods[discovery.APIServer]; found {
			if v, err := stages.ParseVersion(render.TagOf(sp.Image)); err == nil && !v.SameMinor(in.Target) {
				minor = true
			}
		}
	}

	if !minor {
		return ok("patch upgrade: the apiservers restart one at a time")
	}

	u, err := url.Parse(in.Snapshot.Endpoint)
	if err != nil || u.Host == "" {
		return warn(fmt.Sprintf("cannot tell what the endpoint %q is", in.Snapshot.Endpoint), "make sure it balances over every control plane")
	}

	host := u.Hostname()

	for _, n := range cps {
		if host == n.InternalIP || host == n.Name || sameIP(host, n.InternalIP) {
			return warn(fmt.Sprintf("%s is a single control plane (%s): the API is unreachable while its apiserver restarts", in.Snapshot.Endpoint, n.Name),
				"use a VIP or a load balancer over every control plane as the endpoint")
		}
	}

	return ok(fmt.Sprintf("%s is not a single control plane's address", in.Snapshot.Endpoint))
}

func sameIP(a, b string) bool {
	ia, ib := net.ParseIP(a), net.ParseIP(b)

	return ia != nil && ib != nil && ia.Equal(ib)
}
