package compat

import (
	"context"
	"fmt"
	"slices"
	"strings"

	api "github.com/ichor-dev/kubectl-ichor/pkg/api/v1alpha1"
	"github.com/ichor-dev/kubectl-ichor/pkg/text"
)

// Targets are where the operator wants the cluster; a nil target is "leave it as it
// runs": the path then has no hop of that kind.
type Targets struct {
	// Talos is the Talos target, nil for none.
	Talos *Version
	// Kubernetes is the Kubernetes target, nil for none.
	Kubernetes *Version
}

// Request is what a path is planned for.
type Request struct {
	// Nodes are the cluster's nodes, as the rules read them (FromSnapshot).
	Nodes []Node
	// Targets are the versions to reach.
	Targets Targets
	// Via are releases the operator names for the minors the path goes through
	// (--via v1.35.4,v1.36.3): each is used by the hop to its minor, of either kind.
	Via []Version
}

// Hop is one upgrade of a path: an ordinary Kubernetes upgrade (one minor, or a patch) or
// Talos upgrade.
type Hop struct {
	// Kind is api.UpgradeKubernetes or api.UpgradeTalos.
	Kind string
	// From are the versions of its kind the cluster runs when it starts, oldest first.
	From []Version
	// To is the version it goes to.
	To Version
	// Source says where To came from: api.SourceTarget, api.SourceVia or the
	// resolver's (api.SourceRegistry).
	Source string
	// SourceDetail says more of where, in one line.
	SourceDetail string
	// Reason says why it is legal when it starts, in one line.
	Reason string
}

func (h Hop) label() string { return fmt.Sprintf("%s %s", kindName(h.Kind), h.To) }

// Path is the shortest legal sequence of hops from the cluster to the targets; no hop
// when the cluster is there already.
type Path struct {
	// Hops are run in this order.
	Hops []Hop
}

// Planner finds paths. Its resolvers give the releases of intermediate minors the
// operator did not name (nil: only --via gives them).
type Planner struct {
	// Kubernetes finds the newest patch of an intermediate Kubernetes minor.
	Kubernetes Resolver
	// Talos finds the newest patch of an intermediate Talos minor.
	Talos Resolver
}

// Plan finds the shortest sequence of hops from the cluster to the targets in which every
// hop is legal when it starts: a Kubernetes hop moves every component at most one minor
// and only to a version every node's Talos then supports; a Talos hop moves only to a
// version each node may upgrade to from what it then runs and that supports the
// Kubernetes the cluster then runs. Among the shortest it takes Talos first (through the
// releases the operator named, else the newest Talos that is legal), so Kubernetes moves
// only as far as the next Talos needs. An impossible request is a *Refusal that says
// why.
func (p Planner) Plan(ctx context.Context, req Request) (*Path, error) {
	start, err := startState(req.Nodes)
	if err != nil {
		return nil, err
	}

	v, err := newVia(req.Via)
	if err != nil {
		return nil, err
	}

	if err := checkTargets(req.Nodes, req.Targets); err != nil {
		return nil, err
	}

	s := &search{targets: req.Targets, via: v, talosMinors: TalosMinors()}

	steps, err := s.find(start)
	if err != nil {
		return nil, err
	}

	hops, err := p.concrete(ctx, start, steps, v)
	if err != nil {
		return nil, err
	}

	if err := v.unused(hops); err != nil {
		return nil, err
	}

	return &Path{Hops: hops}, nil
}

// state is what the cluster runs between hops (held nodes apart): the distinct Talos and
// Kubernetes versions, oldest first. A hop leaves one version of its kind.
type state struct {
	talos, kube []Version
}

func (s state) key() string { return fmt.Sprint(s.talos, s.kube) }

// after is the state once step is done.
func (s state) after(c step) state {
	if c.kind == api.UpgradeTalos {
		return state{talos: []Version{c.to}, kube: s.kube}
	}

	return state{talos: s.talos, kube: []Version{c.to}}
}

// step is a hop the search considers. An intermediate release not named by the operator
// is to be resolved (source ""): its to is a stand-in of its minor, the newest patch of
// it the cluster runs (else .0); machinery's tables judge Talos minors and Kubernetes
// minors (their bounds are X.Y.0 and X.Y.99), so the stand-in judges as the release
// will, and the path is judged again with the releases found.
type step struct {
	kind   string
	to     Version
	source string
}

func (c step) label() string {
	if c.source == "" {
		return fmt.Sprintf("%s %s", kindName(c.kind), c.to.MinorString())
	}

	return fmt.Sprintf("%s %s", kindName(c.kind), c.to)
}

// legal says whether step c may start from state st.
func legal(st state, c step) error {
	if c.kind == api.UpgradeTalos {
		for _, t := range st.talos {
			if t != c.to {
				if err := Upgradeable(t, c.to); err != nil {
					return err
				}
			}
		}

		for _, k := range st.kube {
			if err := Supports(c.to, k); err != nil {
				return err
			}
		}

		return nil
	}

	for _, k := range st.kube {
		if err := Step(k, c.to); err != nil {
			return err
		}
	}

	for _, t := range st.talos {
		if err := Supports(t, c.to); err != nil {
			return err
		}
	}

	return nil
}

// search is a breadth-first search over states: the first path found to the targets is a
// shortest one, and the order candidates are tried in (Talos first, the newest first)
// decides among the shortest.
type search struct {
	targets     Targets
	via         *via
	talosMinors []Version
}

// done reports whether st is at the targets.
func (s *search) done(st state) bool {
	return at(st.talos, s.targets.Talos) && at(st.kube, s.targets.Kubernetes)
}

// at reports whether every version is target (true for no target).
func at(versions []Version, target *Version) bool {
	if target == nil {
		return true
	}

	for _, v := range versions {
		if v != *target {
			return false
		}
	}

	return true
}

// candidates are the hops to try from st, in the order of preference: Talos to its
// target, then to intermediate minors (those the operator named a release of first, then
// the newest first); then Kubernetes to the newest minor
// one step allows (its target when that is its minor), then to a patch of the newest
// minor it runs (to bring a mixed cluster to one minor).
func (s *search) candidates(st state) []step {
	var out []step

	if t := s.targets.Talos; t != nil && !at(st.talos, t) {
		out = append(out, step{kind: api.UpgradeTalos, to: *t, source: api.SourceTarget})
		floor := st.talos[len(st.talos)-1]

		var named, others []step

		for i := len(s.talosMinors) - 1; i >= 0; i-- {
			m := s.talosMinors[i]
			if m.Major == t.Major && m.Minor < t.Minor && m.Compare(Version{Major: floor.Major, Minor: floor.Minor}) >= 0 {
				if c := s.intermediate(api.UpgradeTalos, m, st.talos); c.source == api.SourceVia {
					named = append(named, c)
				} else {
					others = append(others, c)
				}
			}
		}

		out = append(append(out, named...), others...)
	}

	if k := s.targets.Kubernetes; k != nil && !at(st.kube, k) {
		lo, hi := st.kube[len(st.kube)-1].Minor, min(st.kube[0].Minor+1, k.Minor)

		for m := hi; m >= lo && m <= hi; m-- {
			if m == k.Minor {
				out = append(out, step{kind: api.UpgradeKubernetes, to: *k, source: api.SourceTarget})

				continue
			}

			out = append(out, s.intermediate(api.UpgradeKubernetes, Version{Major: k.Major, Minor: m}, st.kube))
		}
	}

	return out
}

// intermediate is the hop of kind to minor m: the operator's release of it, else a
// stand-in to resolve.
func (s *search) intermediate(kind string, m Version, running []Version) step {
	if v, ok := s.via.lookup(m); ok {
		return step{kind: kind, to: v, source: api.SourceVia}
	}

	to := Version{Major: m.Major, Minor: m.Minor}
	for _, r := range running {
		if r.SameMinor(m) && r.Patch > to.Patch {
			to.Patch = r.Patch
		}
	}

	return step{kind: kind, to: to}
}

// find returns the steps of a shortest legal path from start, or a refusal that names
// what blocks the furthest state the search reached.
func (s *search) find(start state) ([]step, error) {
	type visit struct {
		st     state
		parent int
		by     step
		depth  int
	}

	var (
		visits  = []visit{{st: start, parent: -1}}
		seen    = map[string]bool{start.key(): true}
		blocked *visit
		reasons []string
	)

	for i := 0; i < len(visits); i++ {
		cur := visits[i]

		if s.done(cur.st) {
			var steps []step
			for j := i; visits[j].parent >= 0; j = visits[j].parent {
				steps = append(steps, visits[j].by)
			}

			slices.Reverse(steps)

			return steps, nil
		}

		var why []string

		moved := false

		for _, c := range s.candidates(cur.st) {
			if err := legal(cur.st, c); err != nil {
				why = append(why, c.label()+": "+err.Error())

				continue
			}

			moved = true

			next := cur.st.after(c)
			if !seen[next.key()] {
				seen[next.key()] = true
				visits = append(visits, visit{st: next, parent: i, by: c, depth: cur.depth + 1})
			}
		}

		if !moved && len(why) == 0 {
			// Only Kubernetes can have no candidate: minors more than one apart.
			why = append(why, fmt.Sprintf("Kubernetes: %s are more than one minor apart, and no one hop moves them all", joinVersions(cur.st.kube)))
		}

		if !moved && (blocked == nil || cur.depth > blocked.depth) {
			blocked, reasons = &cur, why
		}
	}

	where := "here"
	if blocked != nil && blocked.depth > 0 {
		where = describeState(blocked.st)
	}

	return nil, &Refusal{
		Reason: fmt.Sprintf("no legal sequence of hops reaches %s: from %s no hop is legal: %s", describeTargets(s.targets), where, text.Summarize(reasons)),
		Action: "choose nearer targets, or hold the nodes that block it",
	}
}

// concrete resolves the releases of the intermediate hops and judges the path again with
// them, hop by hop from start.
func (p Planner) concrete(ctx context.Context, start state, steps []step, v *via) ([]Hop, error) {
	hops := make([]Hop, 0, len(steps))
	st := start

	for i, c := range steps {
		hop := Hop{Kind: c.kind, From: slices.Clone(st.kube), To: c.to, Source: c.source}
		if c.kind == api.UpgradeTalos {
			hop.From = slices.Clone(st.talos)
		}

		switch c.source {
		case api.SourceVia:
			if err := v.use(c.kind, c.to); err != nil {
				return nil, err
			}

			hop.SourceDetail = "--via " + c.to.String()
		case "":
			resolver := p.Kubernetes
			if c.kind == api.UpgradeTalos {
				resolver = p.Talos
			}

			got, err := resolve(ctx, c.kind, c.to, v, resolver)
			if err != nil {
				return nil, err
			}

			hop.To, hop.Source, hop.SourceDetail = got.Version, got.Source, got.Detail
		}

		c = step{kind: c.kind, to: hop.To, source: hop.Source}
		if err := legal(st, c); err != nil {
			return nil, &Refusal{
				Reason: fmt.Sprintf("hop %d, %s (%s): %v", i+1, hop.label(), hop.Source, err),
				Action: fmt.Sprintf("pass the %s release to go through with --via v%s.<patch>", kindName(c.kind), c.to.MinorString()),
			}
		}

		hop.Reason = reason(st, c)
		hops = append(hops, hop)
		st = st.after(c)
	}

	return hops, nil
}

// reason says, in one line, why step c is legal from st.
func reason(st state, c step) string {
	if c.kind == api.UpgradeTalos {
		from := make([]string, 0, len(st.talos))
		for _, t := range st.talos {
			if t != c.to {
				from = append(from, t.String())
			}
		}

		r, _ := KubernetesRange(c.to)

		return fmt.Sprintf("machinery's upgrade table allows %s -> %s; Talos %s supports Kubernetes %s, the cluster runs %s",
			strings.Join(from, ", "), c.to, c.to.MinorString(), r, joinVersions(st.kube))
	}

	move := fmt.Sprintf("one minor from %s", st.kube[0].MinorString())
	if st.kube[0].SameMinor(c.to) {
		move = fmt.Sprintf("a patch within %s", c.to.MinorString())
	}

	if len(st.talos) == 0 {
		return move + "; no Talos node to pair"
	}

	pairs := make([]string, 0, len(st.talos))
	for _, t := range st.talos {
		r, _ := KubernetesRange(t)
		pairs = append(pairs, fmt.Sprintf("%s: %s", t, r))
	}

	if len(st.talos) == 1 {
		r, _ := KubernetesRange(st.talos[0])

		return fmt.Sprintf("%s; Talos %s on every node supports Kubernetes %s", move, st.talos[0], r)
	}

	return fmt.Sprintf("%s; every node's Talos supports it (%s)", move, strings.Join(pairs, "; "))
}

func joinVersions(vs []Version) string {
	out := make([]string, 0, len(vs))
	for _, v := range vs {
		out = append(out, v.String())
	}

	return strings.Join(out, ", ")
}

func describeState(st state) string {
	var parts []string

	if len(st.talos) > 0 {
		parts = append(parts, "Talos "+joinVersions(st.talos))
	}

	if len(st.kube) > 0 {
		parts = append(parts, "Kubernetes "+joinVersions(st.kube))
	}

	return strings.Join(parts, " with ")
}

func describeTargets(t Targets) string {
	var parts []string

	if t.Talos != nil {
		parts = append(parts, "Talos "+t.Talos.String())
	}

	if t.Kubernetes != nil {
		parts = append(parts, "Kubernetes "+t.Kubernetes.String())
	}

	return strings.Join(parts, " and ")
}
