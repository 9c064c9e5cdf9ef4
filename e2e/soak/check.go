package soak

import (
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/ichor-dev/kubectl-ichor/e2e/sim/events"
)

// Facts are what a run saw, for the checker: the simulator's events, the
// pauses the operator read, and the cluster at the end.
type Facts struct {
	Run    Run
	Events []events.Event
	// Cordons are the soak's own NodeCordoned faults, as a person's cordons:
	// from the moment it cordoned to the moment it cleared the fault.
	Cordons []Window
	// Pauses are the pauses of the operation, as `kubectl ichor status -o
	// json` showed each.
	Pauses []Pause
	Final  Final
}

// Window is a node's span of time.
type Window struct {
	Node     string
	From, To time.Time
}

// Pause is a pause as the status document says it.
type Pause struct {
	Stage  string `json:"stage,omitempty"`
	Node   string `json:"node,omitempty"`
	Reason string `json:"reason"`
	Action string `json:"action"`
}

// Final is the cluster at the end of a run.
type Final struct {
	// Phase is the operation's phase per `kubectl ichor status -o json`;
	// StateError why that could not be read (the state ConfigMap not
	// readable), empty when it was.
	Phase      string `json:"phase"`
	StateError string `json:"stateError,omitempty"`
	// Unschedulable are the nodes cordoned, or carrying ichor's cordon mark.
	Unschedulable []string `json:"unschedulable,omitempty"`
	// CredentialsLeft are the runner's credentials still in the cluster
	// ("kind namespace/name").
	CredentialsLeft []string `json:"credentialsLeft,omitempty"`
}

// Outcome is how a run ended, as the checker judges it.
type Outcome string

// The outcomes.
const (
	Succeeded           Outcome = "succeeded"
	PausedThenSucceeded Outcome = "paused-then-succeeded"
	Broken              Outcome = "broken"
	// PausedAsExpected is the self-check's one good outcome.
	PausedAsExpected Outcome = "paused-as-expected"
)

// The phases of the status document the checker reads.
const (
	phaseSucceeded = "Succeeded"
	phasePaused    = "Paused"
)

// Judge checks a run and says its outcome, with every problem found (none
// unless Broken).
func Judge(f Facts) (Outcome, []string) {
	problems := CheckEvents(f.Run, f.Events, f.Cordons)
	for i, p := range f.Pauses {
		if strings.TrimSpace(p.Reason) == "" || strings.TrimSpace(p.Action) == "" {
			problems = append(problems, fmt.Sprintf("pause %d (%s %s) came without a reason and an action: reason %q, action %q", i+1, p.Stage, p.Node, p.Reason, p.Action))
		}
	}
	if f.Final.StateError != "" {
		problems = append(problems, "the state is not readable: "+f.Final.StateError)
	}
	if f.Run.SelfCheck {
		switch {
		case f.Final.Phase != phasePaused:
			problems = append(problems, fmt.Sprintf("self-check: every etcd member stopped, yet the operation ended %s, not Paused", f.Final.Phase))
		case len(f.Pauses) == 0:
			problems = append(problems, "self-check: the operation is Paused but no pause was seen")
		}
		if len(problems) > 0 {
			return Broken, problems
		}
		return PausedAsExpected, nil
	}
	if f.Final.Phase != phaseSucceeded {
		problems = append(problems, fmt.Sprintf("the operation ended %s, not Succeeded", orUnknown(f.Final.Phase)))
	}
	problems = append(problems, NotAtTarget(f.Run, f.Events)...)
	for _, n := range f.Final.Unschedulable {
		problems = append(problems, fmt.Sprintf("%s is left cordoned", n))
	}
	if len(f.Final.CredentialsLeft) > 0 {
		problems = append(problems, "runner credentials left: "+strings.Join(f.Final.CredentialsLeft, ", "))
	}
	switch {
	case len(problems) > 0:
		return Broken, problems
	case len(f.Pauses) > 0:
		return PausedThenSucceeded, nil
	default:
		return Succeeded, nil
	}
}

func orUnknown(s string) string {
	if s == "" {
		return "in an unknown phase"
	}
	return s
}

// CheckEvents checks the simulator's events of a run: the invariant held at
// every component start (no controller-manager, scheduler, kube-proxy or
// kubelet newer than any apiserver); never more than one control plane, nor
// more than the run's maxUnavailable workers, cordoned at once (the person's
// cordons aside); at most one install of the target per node.
func CheckEvents(r Run, evs []events.Event, person []Window) []string {
	var problems []string
	problems = append(problems, invariant(evs)...)
	problems = append(problems, cordons(r, evs, person)...)
	if r.Scenario.Reboots() {
		installs := map[string]int{}
		for _, e := range evs {
			if e.Component == events.TalosInstall && e.Version == r.Scenario.To {
				installs[e.Node]++
			}
		}
		for _, n := range r.Shape.Nodes() {
			if installs[n] > 1 {
				problems = append(problems, fmt.Sprintf("%d installs of Talos %s on %s: one per node per target", installs[n], r.Scenario.To, n))
			}
		}
	}
	return problems
}

// invariant replays the events and reports the first start of each skew.
func invariant(evs []events.Event) []string {
	var problems []string
	running := map[string]events.Event{} // node/component -> its last start
	seen := map[string]bool{}
	for i, e := range evs {
		switch e.Component {
		case events.Talos, events.TalosInstall, events.Cordon:
			continue
		}
		running[e.Node+"/"+e.Component] = e
		var oldest *version
		for _, s := range running {
			if s.Component != events.APIServer {
				continue
			}
			if v, ok := parseVersion(s.Version); ok && (oldest == nil || v.less(*oldest)) {
				oldest = &v
			}
		}
		if oldest == nil {
			continue
		}
		for _, k := range slices.Sorted(maps.Keys(running)) {
			s := running[k]
			if s.Component == events.APIServer {
				continue
			}
			v, ok := parseVersion(s.Version)
			if !ok || !oldest.less(v) {
				continue
			}
			key := k + " " + s.Version + " " + oldest.String()
			if seen[key] {
				continue
			}
			seen[key] = true
			problems = append(problems, fmt.Sprintf("invariant broken at event %d (%s %s %s at %s): %s %s on %s is newer than apiserver %s",
				i+1, e.Node, e.Component, e.Version, e.Time.Format(time.RFC3339Nano), s.Component, s.Version, s.Node, oldest))
		}
	}
	return problems
}

// cordons replays the cordon events and reports each time too many nodes
// were cordoned at once.
func cordons(r Run, evs []events.Event, person []Window) []string {
	var problems []string
	cordoned := map[string]bool{}
	// excluded: a node the soak cordoned as a person, from its cordon until
	// it is uncordoned once the fault was cleared.
	excluded := map[string]bool{}
	reported := map[string]bool{}
	for i, e := range evs {
		for _, w := range person {
			if !e.Time.Before(w.From) && e.Time.Before(w.To) {
				excluded[w.Node] = true
			}
		}
		if e.Component != events.Cordon {
			continue
		}
		cordoned[e.Node] = e.Version == events.Cordoned
		if !cordoned[e.Node] {
			for _, w := range person {
				if w.Node == e.Node && !e.Time.Before(w.To) {
					delete(excluded, e.Node)
				}
			}
		}
		var cps, workers []string
		for _, n := range slices.Sorted(maps.Keys(cordoned)) {
			if !cordoned[n] || excluded[n] {
				continue
			}
			if strings.HasPrefix(n, "cp-") {
				cps = append(cps, n)
			} else {
				workers = append(workers, n)
			}
		}
		if len(cps) > 1 && !reported["cp "+strings.Join(cps, ",")] {
			reported["cp "+strings.Join(cps, ",")] = true
			problems = append(problems, fmt.Sprintf("at event %d (%s): %d control planes cordoned at once (%s): at most one", i+1, e.Time.Format(time.RFC3339Nano), len(cps), strings.Join(cps, ", ")))
		}
		if len(workers) > r.MaxUnavailable && !reported["w "+strings.Join(workers, ",")] {
			reported["w "+strings.Join(workers, ",")] = true
			problems = append(problems, fmt.Sprintf("at event %d (%s): %d workers cordoned at once (%s): maxUnavailable is %d", i+1, e.Time.Format(time.RFC3339Nano), len(workers), strings.Join(workers, ", "), r.MaxUnavailable))
		}
	}
	return problems
}

// NotAtTarget lists what the events say is not at the run's target at the
// end: a Kubernetes upgrade moves every control plane's apiserver,
// controller-manager and scheduler and every node's kubelet (and kube-proxy,
// where it runs); a Talos upgrade every node's Talos; a path both.
func NotAtTarget(r Run, evs []events.Event) []string {
	last := map[string]string{}
	for _, e := range evs {
		last[e.Node+" "+e.Component] = e.Version
	}
	want := map[string]string{} // "node component" -> its version at the end
	for i, n := range r.Shape.Nodes() {
		if r.Scenario.Reboots() {
			want[n+" "+events.Talos] = r.Scenario.TalosTarget()
		}
		if !r.Scenario.Changes() {
			continue
		}
		k8s := r.Scenario.KubernetesTarget()
		if i < r.Shape.ControlPlanes {
			want[n+" "+events.APIServer], want[n+" "+events.ControllerManager], want[n+" "+events.Scheduler] = k8s, k8s, k8s
		}
		want[n+" "+events.Kubelet] = k8s
		if _, runs := last[n+" "+events.KubeProxy]; runs {
			want[n+" "+events.KubeProxy] = k8s
		}
	}
	var problems []string
	for _, k := range slices.Sorted(maps.Keys(want)) {
		if v := last[k]; v != want[k] {
			problems = append(problems, fmt.Sprintf("%s runs %s at the end, not %s", k, orNone(v), want[k]))
		}
	}
	return problems
}

func orNone(v string) string {
	if v == "" {
		return "nothing the events show"
	}
	return v
}

// version is a vMAJOR.MINOR.PATCH version; the checker compares in full.
type version [3]int

func parseVersion(s string) (version, bool) {
	parts := strings.Split(strings.TrimPrefix(s, "v"), ".")
	if len(parts) != 3 || !strings.HasPrefix(s, "v") {
		return version{}, false
	}
	var v version
	for i, p := range parts {
		n, err := strconv.Atoi(p)
		if err != nil {
			return version{}, false
		}
		v[i] = n
	}
	return v, true
}

func (v version) less(o version) bool { return slices.Compare(v[:], o[:]) < 0 }

func (v version) String() string { return fmt.Sprintf("v%d.%d.%d", v[0], v[1], v[2]) }
