package main

// timeline.go lays out one run's steps per node, for its picture (svg.go):
// for kubectl-ichor from the records the measurement reads (the state's node
// timelines, events.jsonl, the runner pods), for talosctl upgrade-k8s from
// its own progress lines, timed as they were printed.

import (
	"cmp"
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/ichor-dev/kubectl-ichor/e2e/sim/events"
	api "github.com/ichor-dev/kubectl-ichor/pkg/api/v1alpha1"
)

// Timeline is one run: its steps, one row per node, on an axis from the
// command's start to its end.
type Timeline struct {
	Title, Subtitle string
	Start, End      time.Time
	// Rows are the rows top to bottom: the nodes, and rows of the run's own
	// ("runner", "cluster").
	Rows  []string
	Steps []Step
	// Bound, when set, is drawn as a row of its own: the bound's terms end
	// to end from Start, what the run would take on its critical path alone.
	Bound *Bound
	// Marks are moments drawn across every row (a stage's end).
	Marks []Mark
}

// Step is one bar: what a row did from From to To.
type Step struct {
	Row, Kind string
	// Label says what it was and when (the bar's tooltip); Text, if set,
	// is written in the bar when it fits.
	Label, Text string
	From, To    time.Time
	// Critical marks a step on the critical path the bound prices: the
	// next critical step cannot start before it ends.
	Critical bool
}

// Mark is a moment across the picture.
type Mark struct {
	At    time.Time
	Label string
}

// Step kinds beyond the stages' names.
const (
	kindKubeProxyPod = "kube-proxy pod"
	kindRunner       = "runner"
	kindPrePull      = "pre-pull"
	kindManifests    = "manifests"
	rowRunner        = "runner"
	rowCluster       = "cluster"
)

// upgradeTimeline is a kubectl-ichor run's picture: a bar per node and stage
// from its apply's start to its verification (verifiedAt, as the gaps
// measure it), the kube-proxy rollout's pods (from their start less the pod
// start PS to Ready, as the bound prices them), the runner pods' tenures
// (from taking the lock to the next one's), each stage's end marked. The
// steps of APIServers, ControlPlaneComponents and Kubelets and the rollout's
// pods are the bound's critical path; the control planes' KubeProxy applies
// overlap the rollout and are not.
func upgradeTimeline(plan *api.Plan, tl stageTimelines, evs []events.Event, pods []runnerPod, ends map[string]time.Time, began, ended time.Time) Timeline {
	t := Timeline{Start: began, End: ended}
	rows := map[string]bool{}

	for _, s := range plan.Stages {
		if s.Skipped {
			continue
		}

		for _, n := range s.Nodes {
			times, ok := tl[s.Name][n.Node]
			rows[n.Node] = true

			if !ok || times.applyStarted.IsZero() || times.done.IsZero() {
				continue
			}

			to := verifiedAt(n, evs, times)
			t.Steps = append(t.Steps, Step{
				Row: n.Node, Kind: s.Name, From: times.applyStarted, To: to, Critical: s.Name != "KubeProxy",
				Label: fmt.Sprintf("%s %s: applied %s, verified %s", n.Node, s.Name, offset(began, times.applyStarted), offset(began, to)),
			})
		}

		if end, ok := ends[s.Name]; ok {
			t.Marks = append(t.Marks, Mark{At: end, Label: s.Name})
		}
	}

	for _, e := range evs {
		if e.Component != events.KubeProxy || e.Version != toVersion {
			continue
		}

		from, to := e.Time.Add(-benchLatencies.PodStart), e.Time.Add(benchLatencies.Ready)
		t.Steps = append(t.Steps, Step{
			Row: e.Node, Kind: kindKubeProxyPod, From: from, To: to, Critical: true,
			Label: fmt.Sprintf("%s kube-proxy %s: started %s, Ready %s", e.Node, e.Version, offset(began, e.Time), offset(began, to)),
		})
	}

	for i, p := range pods {
		to := ended
		if i+1 < len(pods) {
			to = pods[i+1].locked
		}

		if p.locked.IsZero() {
			continue
		}

		t.Steps = append(t.Steps, Step{
			Row: rowRunner, Kind: kindRunner, From: p.locked, To: to, Text: "on " + p.Node,
			Label: fmt.Sprintf("runner %s on %s: the lock from %s", p.Name, p.Node, offset(began, p.locked)),
		})
	}

	t.Rows = nodeOrder(rows)
	if len(pods) > 0 {
		t.Rows = append(t.Rows, rowRunner)
	}

	return t
}

// peerLine is a line talosctl printed, when it was read.
type peerLine struct {
	at   time.Time
	text string
}

var (
	peerSectionRE = regexp.MustCompile(`^updating "?([a-z-]+)"? to version`)
	peerNodeRE    = regexp.MustCompile(`^ ([<>]) "([^"]+)": (.*)$`)
)

// peerTimeline is a talosctl upgrade-k8s run's picture, from its progress
// lines (Talos' pkg/cluster/kubernetes: `updating "kube-apiserver" to
// version ...`, ` > "<node>": starting update`, ` < "<node>": successfully
// updated`, ` > "<node>": pre-pulling <image>`, `updating manifests`): a bar
// per node and component from its "starting update" to its "successfully
// updated" (kube-proxy: to the next line, talosctl patches each control
// plane and does not wait for the rollout), a pre-pull from its line to the
// next, the manifests' sync from its line to the end. talosctl does one thing
// at a time: every step is on its critical path. names maps the addresses
// talosctl prints to node names.
func peerTimeline(lines []peerLine, names map[string]string, began, ended time.Time) Timeline {
	t := Timeline{Start: began, End: ended}
	rows := map[string]bool{}
	section := ""
	open := map[string]time.Time{}

	name := func(addr string) string {
		if n, ok := names[addr]; ok {
			return n
		}

		return addr
	}
	next := func(i int) time.Time {
		if i+1 < len(lines) {
			return lines[i+1].at
		}

		return ended
	}
	add := func(row, kind string, from, to time.Time) {
		t.Steps = append(t.Steps, Step{
			Row: row, Kind: kind, From: from, To: to, Critical: true,
			Label: fmt.Sprintf("%s %s: %s to %s", row, kind, offset(began, from), offset(began, to)),
		})
	}

	for i, l := range lines {
		text := strings.TrimRight(l.text, "\r")

		if m := peerSectionRE.FindStringSubmatch(text); m != nil {
			section = m[1]

			continue
		}

		if strings.HasPrefix(text, "updating manifests") {
			rows[rowCluster] = true

			add(rowCluster, kindManifests, l.at, ended)

			continue
		}

		m := peerNodeRE.FindStringSubmatch(text)
		if m == nil {
			continue
		}

		node := name(m[2])
		rows[node] = true

		switch {
		case m[1] == ">" && strings.HasPrefix(m[3], "pre-pulling "):
			add(node, kindPrePull, l.at, next(i))
		case m[1] == ">" && m[3] == "starting update" && section == "kube-proxy":
			add(node, section, l.at, next(i))
		case m[1] == ">" && m[3] == "starting update":
			open[node] = l.at
		case m[1] == "<" && m[3] == "successfully updated":
			if from, ok := open[node]; ok {
				add(node, section, from, l.at)
				delete(open, node)
			}
		}
	}

	t.Rows = nodeOrder(rows)

	return t
}

// nodeOrder sorts node names as a reader counts them: control planes
// first, then by name with their numbers compared as numbers (worker-2
// before worker-10), the run's own rows last.
func nodeOrder(set map[string]bool) []string {
	out := make([]string, 0, len(set))
	for n := range set {
		out = append(out, n)
	}

	rank := func(n string) int {
		switch {
		case n == rowRunner || n == rowCluster:
			return 2
		case strings.HasPrefix(n, "cp-"):
			return 0
		}

		return 1
	}
	split := func(n string) (string, int) {
		i := strings.LastIndexFunc(n, func(r rune) bool { return r < '0' || r > '9' })
		num, err := strconv.Atoi(n[i+1:])
		if err != nil {
			return n, -1
		}

		return n[:i+1], num
	}

	slices.SortFunc(out, func(a, b string) int {
		if c := cmp.Compare(rank(a), rank(b)); c != 0 {
			return c
		}

		pa, na := split(a)
		pb, nb := split(b)

		return cmp.Or(cmp.Compare(pa, pb), cmp.Compare(na, nb))
	})

	return out
}

// offset is t as seconds since the run's start.
func offset(began, t time.Time) string {
	return fmt.Sprintf("%.2fs", t.Sub(began).Seconds())
}
