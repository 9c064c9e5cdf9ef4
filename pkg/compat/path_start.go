package compat

import (
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/ichor-dev/kubectl-ichor/pkg/text"
)

// startState reads where the path starts: every version the nodes (held nodes apart)
// run. A version that cannot be read refuses: no hop is judged blind.
func startState(nodes []Node) (state, error) {
	var st state

	for _, n := range active(nodes) {
		if n.Talos != "" {
			t, err := ParseVersion(n.Talos)
			if err != nil {
				return state{}, &Refusal{
					Reason: fmt.Sprintf("node %q: Talos version: %v", n.Name, err),
					Action: "check the node's Talos version (talosctl version), or hold it", Nodes: []string{n.Name},
				}
			}

			st.talos = addVersion(st.talos, t)
		}

		for _, c := range n.Kubernetes {
			k, err := ParseVersion(c.Version)
			if err != nil {
				return state{}, &Refusal{
					Reason: fmt.Sprintf("node %q: %s: %v", n.Name, c.Name, err),
					Action: "give it an image tagged vMAJOR.MINOR.PATCH, or hold the node", Nodes: []string{n.Name},
				}
			}

			st.kube = addVersion(st.kube, k)
		}
	}

	return st, nil
}

// addVersion adds v to the sorted set vs.
func addVersion(vs []Version, v Version) []Version {
	i, found := slices.BinarySearchFunc(vs, v, Version.Compare)
	if found {
		return vs
	}

	return slices.Insert(vs, i, v)
}

// checkTargets refuses, before any search, what no path can reach: no target, a
// downgrade, a Talos this build does not know, a Kubernetes no Talos it knows supports,
// targets that do not go together, and a target that needs the other kind to move
// when that kind has no target.
func checkTargets(nodes []Node, targets Targets) error {
	t, k := targets.Talos, targets.Kubernetes

	if t == nil && k == nil {
		return &Refusal{Reason: "no target", Action: "pass a Talos target, a Kubernetes target, or both"}
	}

	if t != nil {
		if err := checkTalosTarget(nodes, *t); err != nil {
			return err
		}
	}

	if k != nil {
		if err := checkKubernetesTarget(nodes, *k); err != nil {
			return err
		}
	}

	switch {
	case t != nil && k != nil:
		if err := Supports(*t, *k); err != nil {
			action := "choose targets that go together"
			if r, _ := KubernetesRange(*t); k.Minor > r.Hi {
				if m, ok := TalosFor(*k, *t); ok {
					action = fmt.Sprintf("Kubernetes %s needs Talos %s or newer: choose a Talos target of it (%s)", k, m.MinorString(), releaseOf(m))
				}
			} else {
				action = fmt.Sprintf("choose a Kubernetes target in %s", r)
			}

			return &Refusal{Reason: "the targets do not go together: " + err.Error(), Action: action}
		}
	case k != nil:
		// Talos stays: the nodes' Talos must support the Kubernetes target.
		for _, g := range talosGroups(nodes) {
			if err := Supports(g.version, *k); err != nil {
				action := "choose a Kubernetes target every node's Talos supports"
				if m, ok := TalosFor(*k, g.version); ok && g.version.Compare(m) < 0 {
					action = fmt.Sprintf("add a Talos target: Kubernetes %s needs Talos %s or newer (%s)", k, m.MinorString(), releaseOf(m))
				}

				return &Refusal{Reason: fmt.Sprintf("no Talos target, and the nodes' Talos does not support Kubernetes %s: %v (on %s)", k, err, text.SummarizeList(g.nodes)),
					Action: action, Nodes: g.nodes}
			}
		}
	case t != nil:
		// Kubernetes stays: the Talos target must support what the cluster runs.
		if v := TalosSupports(nodes, *t); !v.Allowed {
			r, _ := KubernetesRange(*t)

			return &Refusal{Reason: "no Kubernetes target, and " + v.Detail,
				Action: fmt.Sprintf("add a Kubernetes target in %s (Kubernetes moves first)", r), Nodes: v.Nodes}
		}
	}

	return nil
}

// checkTalosTarget refuses a Talos target this build does not know and a downgrade.
func checkTalosTarget(nodes []Node, t Version) error {
	var unknown *UnknownTalosError
	if err := KnownTalos(t); errors.As(err, &unknown) {
		return &Refusal{Reason: "Talos target: " + unknown.Error(), Action: unknown.Action()}
	}

	var newer []string

	for _, g := range talosGroups(nodes) {
		if g.version.Compare(t) > 0 {
			newer = append(newer, fmt.Sprintf("%s on %s", g.raw, text.SummarizeList(g.nodes)))
		}
	}

	if len(newer) > 0 {
		return &Refusal{
			Reason: fmt.Sprintf("Talos target %s is older than %s: downgrades are not supported", t, strings.Join(newer, ", ")),
			Action: "choose a Talos target at or above what every node runs, or hold the nodes behind",
		}
	}

	return nil
}

// checkKubernetesTarget refuses a downgrade of any component, a change of major, and a
// Kubernetes no Talos this build knows supports.
func checkKubernetesTarget(nodes []Node, k Version) error {
	var newer, major []string

	for _, n := range active(nodes) {
		for _, c := range n.Kubernetes {
			v, err := ParseVersion(c.Version)

			switch {
			case err != nil:
			case v.Compare(k) > 0:
				newer = append(newer, fmt.Sprintf("%s %s on %s", c.Name, v, n.Name))
			case v.Major != k.Major:
				major = append(major, fmt.Sprintf("%s %s on %s", c.Name, v, n.Name))
			}
		}
	}

	if len(newer) > 0 {
		return &Refusal{
			Reason: fmt.Sprintf("Kubernetes target %s is older than %s: downgrades are not supported", k, text.Summarize(newer)),
			Action: "choose a Kubernetes target at or above what every node runs, or hold the nodes behind",
		}
	}

	if len(major) > 0 {
		return &Refusal{
			Reason: fmt.Sprintf("Kubernetes target %s changes the major version from %s: not supported", k, text.Summarize(major)),
			Action: "choose a Kubernetes target of the major the cluster runs",
		}
	}

	if _, ok := TalosFor(k, Version{}); !ok {
		newest := NewestTalos()
		r, _ := KubernetesRange(newest)

		return &Refusal{
			Reason: fmt.Sprintf("no Talos release this build knows supports Kubernetes %s (Talos %s supports up to 1.%d)", k, newest.MinorString(), r.Hi),
			Action: "upgrade kubectl-ichor to a release that knows one (kubectl krew upgrade ichor), or choose another Kubernetes target",
		}
	}

	return nil
}
