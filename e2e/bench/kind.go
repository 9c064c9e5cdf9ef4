package main

// kind.go is what differs between the two upgrade benchmarks, a Kubernetes
// upgrade ("upgrade") and a Talos OS upgrade ("talos"): the cluster's
// versions, the command, the lower bound and its formula. Everything else
// (the run, the records read, the gaps, the picture) is theirs alike.

import (
	"github.com/ichor-dev/kubectl-ichor/e2e/sim/events"
)

// The Talos OS upgrade benchmark's versions: the last Talos 1.13 to the
// current 1.14 (whose installer is the Image Factory's, no generic one), on
// a Kubernetes both run.
const (
	talosFrom       = "v1.13.9"
	talosTo         = "v1.14.1"
	talosKubernetes = "v1.36.3"
)

// upgradeKind is one of the two upgrade benchmarks.
type upgradeKind struct {
	// name is the benchmark's: its report is NAME.json and NAME.txt.
	name string
	// what is the plugin's: kubectl-ichor upgrade WHAT --to TO.
	what string
	// talos and kubernetes are the cluster's versions at the start, from the
	// one the upgrade moves, to its target.
	talos, kubernetes, from, to string
	// sizes are the benchmark's cluster sizes and their own --max-unavailable.
	sizes func(o options) ([]int, map[int]int)
	// timelines begins the name of each run's picture.
	timelines string
	// formula is bound's, for the summary.
	formula string
	// bound is the critical path of an upgrade of cps control planes and
	// workers, mu workers at a time, with what the cluster's own events
	// measured.
	bound func(l Latencies, cps, workers, mu int, evs []events.Event) Bound
	// peer says whether talosctl has a peer command to run beside it.
	peer bool
}

var (
	kubernetesUpgrade = upgradeKind{
		name: "upgrade", what: "kubernetes", talos: talosVersion, kubernetes: fromVersion, from: fromVersion, to: toVersion,
		sizes:     func(o options) ([]int, map[int]int) { return o.upgradeSizes, o.sizeMU },
		timelines: "timeline-", formula: boundFormula, peer: true,
		bound: func(l Latencies, cps, workers, mu int, evs []events.Event) Bound {
			return lowerBound(l, cps, workers, mu, daemonSetPace(evs))
		},
	}
	talosUpgrade = upgradeKind{
		name: "talos", what: "talos", talos: talosFrom, kubernetes: talosKubernetes, from: talosFrom, to: talosTo,
		sizes:     func(o options) ([]int, map[int]int) { return o.talosSizes, o.talosMU },
		timelines: "timeline-talos-", formula: talosBoundFormula,
		bound: func(l Latencies, cps, workers, mu int, _ []events.Event) Bound {
			return talosBound(l, cps, workers, mu)
		},
	}
)
