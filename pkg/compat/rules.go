package compat

import (
	"errors"
	"fmt"
	"sort"
	"strings"

	api "github.com/ichor-dev/kubectl-ichor/pkg/api/v1alpha1"
	"github.com/ichor-dev/kubectl-ichor/pkg/text"
)

// Node is what the version rules read of one node.
type Node struct {
	// Name is the Node's name.
	Name string
	// Held is true for a node the ichor.dev/hold annotation excludes: no rule judges it,
	// and no hop moves it.
	Held bool
	// HoldReason is the hold annotation's value.
	HoldReason string
	// Talos is the Talos version the node runs, as Talos reports it; "" for a node
	// that is not Talos (or whose Talos was not read), which the Talos rules skip.
	Talos string
	// Kubernetes is every Kubernetes component version the node runs.
	Kubernetes []Component
}

// Component is one Kubernetes component version a node runs.
type Component struct {
	// Name says what it is: "kubelet", "kube-apiserver" (its machine config's image),
	// "kube-apiserver pod" (its mirror pod).
	Name string
	// Version is the version read, vX.Y.Z when it can be judged; anything else (a
	// digest-only image, a -rc tag, nothing read) is refused as such.
	Version string
}

// Verdict is one rule's answer for a cluster and a target: the detail is one line a plan
// prints as the check's row and an engine gives as its pause's reason.
type Verdict struct {
	// Allowed is false when the rule refuses.
	Allowed bool
	// Detail says what was found, in one line.
	Detail string
	// Action says what to do about a refusal.
	Action string
	// Nodes are the nodes a refusal is about (a pause names the node when there is one).
	Nodes []string
}

// Err is nil when the verdict allows, else a *Refusal.
func (v Verdict) Err() error {
	if v.Allowed {
		return nil
	}

	return &Refusal{Reason: v.Detail, Action: v.Action, Nodes: v.Nodes}
}

// Check is the verdict as a plan's check row.
func (v Verdict) Check(name string) api.Check {
	if v.Allowed {
		return api.Check{Name: name, Result: api.ResultOK, Detail: v.Detail}
	}

	return api.Check{Name: name, Result: api.ResultRefused, Detail: v.Detail, Action: v.Action}
}

// Refusal is a rule's or the path planner's refusal: one line of reason, one of action.
type Refusal struct {
	// Reason says what is wrong.
	Reason string
	// Action says what to do.
	Action string
	// Nodes are the nodes it is about, if any.
	Nodes []string
}

// Error implements error.
func (r *Refusal) Error() string { return r.Reason }

func allowed(detail string) Verdict { return Verdict{Allowed: true, Detail: detail} }

func refused(detail, action string, nodes ...string) Verdict {
	return Verdict{Detail: detail, Action: action, Nodes: nodes}
}

// active returns the nodes an upgrade visits: every node not held.
func active(nodes []Node) []Node {
	var out []Node

	for _, n := range nodes {
		if !n.Held {
			out = append(out, n)
		}
	}

	return out
}

// The rules' names: a plan's check row and an engine's pause name a rule alike.
const (
	NameKubernetesStep      = "version skew"
	NameKubernetesSupported = "talos pairing"
	NameTalosUpgradeable    = "upgrade path"
	NameTalosSupports       = "kubernetes on target"
)

// KubernetesStep is "one Kubernetes minor at a time, no downgrade": every component
// every node runs (held nodes apart) may move to target, judged per node against what
// it runs. The same problem on several nodes is said once, naming them.
func KubernetesStep(nodes []Node, target Version) Verdict {
	var (
		oldest   *Version
		problems []string
		nodesOf  = map[string][]string{}
		compsOf  = map[string]map[string]bool{}
		refusing []string
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

		if len(refusing) == 0 || refusing[len(refusing)-1] != node {
			refusing = append(refusing, node)
		}
	}

	for _, n := range active(nodes) {
		for _, c := range n.Kubernetes {
			v, err := ParseVersion(c.Version)
			if err != nil {
				note(err.Error(), c.Name, n.Name)

				continue
			}

			if oldest == nil || v.Compare(*oldest) < 0 {
				oldest = &v
			}

			if err := Step(v, target); err != nil {
				note(err.Error(), c.Name, n.Name)
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

		return refused(text.Summarize(lines), "choose a target one minor at most above what every node runs, or hold the nodes behind", unique(refusing)...)
	}

	switch {
	case oldest == nil:
		return allowed("no node to upgrade")
	case oldest.SameMinor(target):
		return allowed(fmt.Sprintf("patch upgrade within %s", target.MinorString()))
	default:
		return allowed(fmt.Sprintf("one minor (%s -> %s), no node behind", oldest.MinorString(), target.MinorString()))
	}
}

// talosGroup is the nodes that run one Talos version.
type talosGroup struct {
	raw     string
	version Version
	err     error
	nodes   []string
}

// talosGroups groups the Talos nodes (held nodes apart) by the version they run, oldest
// first; versions that do not parse come first, in their text's order.
func talosGroups(nodes []Node) []talosGroup {
	byRaw := map[string]*talosGroup{}

	var out []*talosGroup

	for _, n := range active(nodes) {
		if n.Talos == "" {
			continue
		}

		g, ok := byRaw[n.Talos]
		if !ok {
			v, err := ParseVersion(n.Talos)
			g = &talosGroup{raw: n.Talos, version: v, err: err}
			byRaw[n.Talos] = g
			out = append(out, g)
		}

		g.nodes = append(g.nodes, n.Name)
	}

	sort.SliceStable(out, func(i, j int) bool {
		a, b := out[i], out[j]
		if (a.err != nil) != (b.err != nil) {
			return a.err != nil
		}

		if a.err != nil {
			return a.raw < b.raw
		}

		return a.version.Compare(b.version) < 0
	})

	groups := make([]talosGroup, 0, len(out))
	for _, g := range out {
		groups = append(groups, *g)
	}

	return groups
}

// KubernetesSupported is "Kubernetes target is supported by every node's Talos" (held
// nodes apart), per machinery's tables. A node's Talos that does not parse, or whose
// minor this build does not know, refuses.
func KubernetesSupported(nodes []Node, target Version) Verdict {
	groups := talosGroups(nodes)
	if len(groups) == 0 {
		return allowed("no Talos node to pair")
	}

	var (
		details, problems []string
		refusing          []string
		tooNew            bool
		oldest            *Version
		common            = Range{Hi: probeMinors}
	)

	for _, g := range groups {
		where := text.SummarizeList(g.nodes)

		if g.err != nil {
			return refused(fmt.Sprintf("Talos version on %s: %v", where, g.err), "check the nodes' Talos version (talosctl version)", g.nodes...)
		}

		r, err := KubernetesRange(g.version)
		if err != nil {
			unknown := &UnknownTalosError{Version: g.version, Where: " (on " + where + ")"}

			return refused(unknown.Error(), unknown.Action(), g.nodes...)
		}

		common.Lo, common.Hi = max(common.Lo, r.Lo), min(common.Hi, r.Hi)

		if err := Supports(g.version, target); err != nil {
			if r.Contains(target) {
				problems = append(problems, fmt.Sprintf("Talos %s (on %s): %v", g.raw, where, err))
			} else {
				problems = append(problems, fmt.Sprintf("Talos %s (on %s) supports Kubernetes %s, not %s", g.raw, where, r, target))
			}

			tooNew = tooNew || target.Minor > r.Hi
			refusing = append(refusing, g.nodes...)

			if oldest == nil {
				oldest = &g.version
			}

			continue
		}

		details = append(details, fmt.Sprintf("Talos %s supports Kubernetes %s", g.raw, r))
	}

	if len(problems) == 0 {
		return allowed(strings.Join(details, "; "))
	}

	action := fmt.Sprintf("pick a --to in %s, which every node's Talos supports", common)
	if common.Lo > common.Hi {
		action = "no Kubernetes minor is supported by every node's Talos: upgrade the Talos behind first (kubectl ichor upgrade talos)"
	}

	if tooNew {
		if m, ok := TalosFor(target, *oldest); ok {
			action = fmt.Sprintf("upgrade Talos to %s first: kubectl ichor upgrade talos --to %s", m.MinorString(), releaseOf(m))
		} else {
			action = "no Talos release this build knows supports it: upgrade kubectl-ichor (kubectl krew upgrade ichor), or pick another --to"
		}
	}

	return refused(text.Summarize(problems), action, refusing...)
}

// TalosUpgradeable is "Talos target may be installed from each node's Talos" (held
// nodes apart): not a downgrade, a minor this build knows, and allowed by machinery's
// upgrade table.
func TalosUpgradeable(nodes []Node, target Version) Verdict {
	var unknown *UnknownTalosError
	if err := KnownTalos(target); errors.As(err, &unknown) {
		return refused(unknown.Error(), unknown.Action())
	}

	var (
		problems, refusing []string
		downgrades         int
		from               []string
	)

	for _, g := range talosGroups(nodes) {
		if g.err != nil {
			for _, n := range g.nodes {
				problems = append(problems, fmt.Sprintf("%s: Talos version: %v", n, g.err))
			}

			refusing = append(refusing, g.nodes...)

			continue
		}

		if err := Upgradeable(g.version, target); err != nil {
			for _, n := range g.nodes {
				problems = append(problems, fmt.Sprintf("%s: %v", n, err))
			}

			if g.version.Compare(target) > 0 {
				downgrades += len(g.nodes)
			}

			refusing = append(refusing, g.nodes...)

			continue
		}

		if g.version != target {
			from = append(from, g.raw)
		}
	}

	if len(problems) > 0 {
		action := "upgrade through an intermediate Talos release first (see the Talos upgrade notes)"
		if downgrades == len(problems) {
			action = "choose a target at or above the Talos every node runs, or hold the nodes behind"
		}

		return refused(text.Summarize(problems), action, refusing...)
	}

	if len(from) == 0 {
		return allowed(fmt.Sprintf("every node runs %s", target))
	}

	return allowed(fmt.Sprintf("%s -> %s supported by machinery's upgrade table", strings.Join(from, ", "), target))
}

// TalosSupports is "Talos target supports the Kubernetes the cluster runs": every
// component version every node runs (held nodes apart), each version judged once.
func TalosSupports(nodes []Node, target Version) Verdict {
	var unknown *UnknownTalosError

	r, err := KubernetesRange(target)
	if errors.As(err, &unknown) {
		return refused(unknown.Error(), unknown.Action())
	}

	var problems, refusing []string

	// Each version is said once, with the first node that runs it (a line per node
	// would repeat it); every node that runs a refused version is named in Nodes.
	refusedVersion := map[string]bool{}
	seen := map[string]bool{}

	for _, n := range active(nodes) {
		for _, c := range n.Kubernetes {
			if seen[c.Version] {
				if refusedVersion[c.Version] {
					refusing = append(refusing, n.Name)
				}

				continue
			}

			seen[c.Version] = true

			v, err := ParseVersion(c.Version)
			if err != nil {
				problems = append(problems, fmt.Sprintf("%s %s: %v", n.Name, c.Name, err))
				refusing = append(refusing, n.Name)
				refusedVersion[c.Version] = true

				continue
			}

			if err := Supports(target, v); err != nil {
				if r.Contains(v) {
					problems = append(problems, fmt.Sprintf("Kubernetes %s (%s on %s): %v", c.Version, c.Name, n.Name, err))
				} else {
					problems = append(problems, fmt.Sprintf("Kubernetes %s (%s on %s) is outside %s", c.Version, c.Name, n.Name, r))
				}

				refusing = append(refusing, n.Name)
				refusedVersion[c.Version] = true
			}
		}
	}

	if len(problems) > 0 {
		return refused(fmt.Sprintf("Talos %s supports Kubernetes %s: %s", target, r, text.Summarize(problems)),
			"move Kubernetes into that range first (kubectl ichor plan kubernetes --to ...)", unique(refusing)...)
	}

	return allowed(fmt.Sprintf("Talos %s supports Kubernetes %s", target, r))
}

// unique is list without repeats, in first-seen order.
func unique(list []string) []string {
	seen := map[string]bool{}

	var out []string

	for _, s := range list {
		if !seen[s] {
			seen[s] = true
			out = append(out, s)
		}
	}

	return out
}
