package main

// measure.go reads what happened in a finished upgrade from records that
// are none of them the plugin's own output: the state ConfigMap (each node's
// timeline per stage, the plan), the simulator's events.jsonl (when each
// component started at a version on each node) and the runner pods'
// records (runner.go). From them: the split of the wall time, each stage's
// time against its share of the bound, and the gaps between a node verified
// and the next apply.

import (
	"context"
	"encoding/json"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/ichor-dev/kubectl-ichor/e2e/sim/cluster"
	"github.com/ichor-dev/kubectl-ichor/e2e/sim/events"
	api "github.com/ichor-dev/kubectl-ichor/pkg/api/v1alpha1"
	"github.com/ichor-dev/kubectl-ichor/pkg/job"
)

// measureUpgrade reads the records of a finished upgrade into r and
// returns the run's timeline, its picture's content.
func measureUpgrade(ctx context.Context, k upgradeKind, dir string, client kubernetes.Interface, began, ended time.Time, r *UpgradeResult) (Timeline, error) {
	cm, err := client.CoreV1().ConfigMaps(stateNamespace).Get(ctx, job.StateName, metav1.GetOptions{})
	if err != nil {
		return Timeline{}, fmt.Errorf("state: %w", err)
	}

	op, err := job.DecodeState(cm)
	if err != nil {
		return Timeline{}, err
	}

	if op.Status.Phase != api.PhaseSucceeded {
		return Timeline{}, fmt.Errorf("operation %s is %s: %s", op.Spec.ID, op.Status.Phase, op.Status.Reason)
	}

	raw, err := job.StatePlan(cm)
	if err != nil {
		return Timeline{}, err
	}

	var plan api.Plan
	if err := json.Unmarshal(raw, &plan); err != nil {
		return Timeline{}, fmt.Errorf("the state's plan: %w", err)
	}

	evs, err := events.Read(filepath.Join(dir, cluster.EventsFile))
	if err != nil {
		return Timeline{}, err
	}

	pods, err := runnerPods(ctx, filepath.Join(dir, cluster.LogDir, "pods"), op.Spec.CreatedAt.Time)
	if err != nil {
		return Timeline{}, err
	}

	self := ""
	if len(pods) > 0 {
		self = pods[0].Node
	}

	r.KubernetesByRequest, r.TalosByMethod = map[string]int{}, map[string]int{}

	for _, p := range pods {
		r.RunnerPods = append(r.RunnerPods, p.RunnerPod)
		r.RunnerPeakRSSMiB = max(r.RunnerPeakRSSMiB, p.MaxRSSMiB)
		r.RunnerCPUSeconds = round(r.RunnerCPUSeconds + p.CPUSeconds)
		r.KubernetesRequests += p.stats.kube
		r.TalosCalls += p.stats.talos

		for k, v := range p.stats.kubeBy {
			r.KubernetesByRequest[k] += v
		}

		for k, v := range p.stats.talosBy {
			r.TalosByMethod[k] += v
		}
	}

	r.KubernetesPerNode = round(float64(r.KubernetesRequests) / float64(r.Nodes))
	r.TalosPerNode = round(float64(r.TalosCalls) / float64(r.Nodes))

	r.LowerBound = k.bound(benchLatencies, r.ControlPlanes, r.Workers, r.MaxUnavailable, evs)
	r.Ratio = round(r.WallSeconds / r.LowerBound.Seconds)

	tl := timelines(op)
	first, last := tl.span()

	if !first.IsZero() {
		r.LaunchSeconds = round(first.Sub(began).Seconds())
		r.RunSeconds = round(last.Sub(first).Seconds())
		r.TailSeconds = round(ended.Sub(last).Seconds())
	}

	var takeovers []time.Time
	for _, p := range pods[min(1, len(pods)):] {
		takeovers = append(takeovers, p.locked)
	}

	var ends map[string]time.Time

	r.Gaps, ends = gaps(&plan, tl, evs, self, r.MaxUnavailable, takeovers)

	prev := began

	for _, s := range plan.Stages {
		st := StageTime{Stage: s.Name}

		for _, t := range r.LowerBound.Terms {
			if t.Stage == s.Name {
				st.BoundSeconds = round(st.BoundSeconds + t.Seconds)
			}
		}

		if end, ok := ends[s.Name]; ok && !prev.IsZero() {
			st.Seconds = round(end.Sub(prev).Seconds())
			prev = end
		} else {
			prev = time.Time{}
		}

		r.Stages = append(r.Stages, st)
	}

	t := upgradeTimeline(&plan, tl, evs, pods, ends, began, ended)
	t.Bound = &r.LowerBound

	return t, nil
}

// nodeTimes are a node's times in one stage.
type nodeTimes struct {
	applyStarted, done time.Time
}

// stageTimelines are the state's timelines by stage and node.
type stageTimelines map[string]map[string]nodeTimes

func timelines(op *api.Operation) stageTimelines {
	out := stageTimelines{}

	for _, n := range op.Status.Nodes {
		for _, t := range n.Timeline {
			if out[t.Stage] == nil {
				out[t.Stage] = map[string]nodeTimes{}
			}

			var nt nodeTimes
			if t.ApplyStarted != nil {
				nt.applyStarted = t.ApplyStarted.Time
			}

			if t.Done != nil {
				nt.done = t.Done.Time
			}

			out[t.Stage][n.Name] = nt
		}
	}

	return out
}

// span is the first apply's start and the last node's end.
func (tl stageTimelines) span() (first, last time.Time) {
	for _, nodes := range tl {
		for _, t := range nodes {
			if !t.applyStarted.IsZero() && (first.IsZero() || t.applyStarted.Before(first)) {
				first = t.applyStarted
			}

			if t.done.After(last) {
				last = t.done
			}
		}
	}

	return first, last
}

// group is nodes that move together in a stage.
type group []api.NodeStep

func (g group) String() string {
	names := make([]string, 0, len(g))
	for _, n := range g {
		names = append(names, n.Node)
	}

	if len(names) == 1 {
		return names[0]
	}

	return "[" + strings.Join(names, " ") + "]"
}

// groups lays out a stage's nodes as the engine visits them: control planes
// one at a time, then workers maxUnavailable at a time, the runner's node
// last in its group (the plan was made before a runner had a node).
func groups(s api.Stage, self string, maxUnavailable int) []group {
	var cps, workers []api.NodeStep

	for _, n := range s.Nodes {
		if n.Role == api.RoleControlPlane {
			cps = append(cps, n)
		} else {
			workers = append(workers, n)
		}
	}

	last := func(list []api.NodeStep) []api.NodeStep {
		i := slices.IndexFunc(list, func(n api.NodeStep) bool { return n.Node == self })
		if i < 0 {
			return list
		}

		n := list[i]

		return append(slices.Delete(slices.Clone(list), i, i+1), n)
	}

	var out []group

	for _, n := range last(cps) {
		out = append(out, group{n})
	}

	workers = last(workers)
	for i := 0; i < len(workers); i += maxUnavailable {
		out = append(out, group(workers[i:min(i+maxUnavailable, len(workers))]))
	}

	return out
}

// staticPods are the components whose verification waits for a mirror pod's
// readiness after the start the events log records.
var staticPods = map[string]bool{events.APIServer: true, events.ControllerManager: true, events.Scheduler: true}

// verifiedAt is when the cluster made a node's verification in a stage true:
// the last start, at the target, of a component the stage changes on the
// node (plus the readiness latency of a static pod), from events.jsonl; for a
// node where no component restarts (KubeProxy on a control plane: kube-proxy
// moves with the DaemonSet), when the runner saw it done. A control plane's
// new kubelet is verified once the static pods it restarted are Ready again.
func verifiedAt(n api.NodeStep, evs []events.Event, t nodeTimes) time.Time {
	if slices.ContainsFunc(n.Changes, func(c api.Change) bool { return c.Component == events.Talos }) {
		return talosVerifiedAt(n, evs, t)
	}

	var at time.Time

	for _, ch := range n.Changes {
		if ch.Component == events.KubeProxy {
			continue
		}

		for _, e := range evs {
			if e.Node != n.Node || e.Component != ch.Component || e.Version != tagOf(ch.To) {
				continue
			}

			ready := e.Time
			if staticPods[e.Component] {
				ready = ready.Add(benchLatencies.Ready)
			}

			at = later(at, ready)

			break
		}
	}

	if at.IsZero() {
		return t.done
	}

	// A control plane's kubelet on a new version restarts its static pods, which
	// the stage waits Ready: the node is verified once the last of them is.
	if kubelet := at; n.Role == api.RoleControlPlane && slices.ContainsFunc(n.Changes, func(c api.Change) bool { return c.Component == events.Kubelet }) {
		for _, e := range evs {
			if e.Node == n.Node && staticPods[e.Component] && e.Time.After(kubelet) {
				at = later(at, e.Time.Add(benchLatencies.Ready))
			}
		}
	}

	return at
}

// talosVerifiedAt is when the cluster made a node's Talos upgrade true: its
// Node Ready on the new Talos, the readiness latency after the later of its
// boot at the target and its kubelet's first start in that boot (etcd's
// health, on a control plane, comes with the boot in the simulator); when
// the runner saw it done if the events have no such boot.
func talosVerifiedAt(n api.NodeStep, evs []events.Event, t nodeTimes) time.Time {
	var to string

	for _, ch := range n.Changes {
		if ch.Component == events.Talos {
			to = ch.To
		}
	}

	var booted time.Time

	for _, e := range evs {
		if e.Node == n.Node && e.Component == events.Talos && e.Version == to {
			booted = e.Time

			break
		}
	}

	if booted.IsZero() {
		return t.done
	}

	at := booted

	for _, e := range evs {
		// The kubelet starts with the boot, its event a moment before or after the boot's.
		if e.Node == n.Node && e.Component == events.Kubelet && e.Time.After(booted.Add(-time.Second)) {
			at = later(at, e.Time)

			break
		}
	}

	return at.Add(benchLatencies.Ready)
}

// gaps are the waits between a group being verified and the next group's
// apply starting, within each stage, and at each stage's start (less its
// pre-pull, and for Kubelets the kube-proxy rollout before it). It also
// returns when each stage ended: its last group verified (KubeProxy: its
// rollout done).
func gaps(plan *api.Plan, tl stageTimelines, evs []events.Event, self string, maxUnavailable int, takeovers []time.Time) (GapReport, map[string]time.Time) {
	var (
		ends    = map[string]time.Time{}
		rep     GapReport
		prevEnd time.Time // when the previous stage's last group was verified (or its rollout done)
		prevWho string
	)

	for _, s := range plan.Stages {
		if s.Skipped {
			continue
		}

		times := tl[s.Name]

		var prevVerified time.Time

		prev := ""

		for i, g := range groups(s, self, maxUnavailable) {
			var started, verified time.Time

			complete := true

			for _, n := range g {
				t, ok := times[n.Node]
				if !ok || t.done.IsZero() {
					complete = false

					continue
				}

				if !t.applyStarted.IsZero() && (started.IsZero() || t.applyStarted.Before(started)) {
					started = t.applyStarted
				}

				verified = later(verified, verifiedAt(n, evs, t))
			}

			if !complete || started.IsZero() {
				rep.Missing = append(rep.Missing, fmt.Sprintf("%s %s", s.Name, g))
				prevVerified, prev = time.Time{}, ""

				continue
			}

			switch {
			case i > 0 && !prevVerified.IsZero():
				rep.Gaps = append(rep.Gaps, newGap(s.Name, prev, g.String(), prevVerified, started, podsStopping(s.Name, g, evs, prevVerified, started), takeovers))
			case i == 0 && !prevEnd.IsZero():
				// Nothing is required at a stage's start: its images were pulled while the
				// stage before ran.
				rep.Gaps = append(rep.Gaps, newGap(s.Name, prevWho, g.String(), prevEnd, started, 0, takeovers))
			}

			prevVerified, prev = verified, g.String()
		}

		prevEnd, prevWho = prevVerified, s.Name+" "+prev

		if s.Name == "KubeProxy" && !prevEnd.IsZero() {
			prevEnd, prevWho = later(prevEnd, rolloutDone(evs)), "KubeProxy rollout"
		}

		if !prevEnd.IsZero() {
			ends[s.Name] = prevEnd
		}
	}

	var counted []float64

	for _, g := range rep.Gaps {
		if !g.RunnerReplaced {
			counted = append(counted, g.Seconds)
		}
	}

	if len(counted) > 0 {
		rep.LongestSeconds = slices.Max(counted)
		rep.MedianSeconds = spread(counted).Median
	}

	return rep, ends
}

// podsStopping is the cluster's own share of a gap in the Kubelets stage: a
// batch's kubelets restart once its drain has ended, so when a pod evicted
// from one of its nodes stopped between the batch before verified and its
// apply, the gap held that pod's termination (T), which the bound counts for
// the batch. A Talos node installs while its pods stop: none of theirs is.
func podsStopping(stage string, g group, evs []events.Event, from, to time.Time) time.Duration {
	if stage != "Kubelets" {
		return 0
	}

	for _, e := range evs {
		if e.Component != events.PodStopped || e.Time.Before(from) || e.Time.After(to) {
			continue
		}

		if slices.ContainsFunc(g, func(n api.NodeStep) bool { return n.Node == e.Node }) {
			return benchLatencies.PodTermination
		}
	}

	return 0
}

func newGap(stage, from, to string, verified, started time.Time, required time.Duration, takeovers []time.Time) Gap {
	g := Gap{Stage: stage, From: from, To: to, Required: required.Seconds()}
	g.Seconds = round(started.Sub(verified).Seconds() - g.Required)

	for _, t := range takeovers {
		// The lock's time is to the second.
		if !t.Before(verified.Truncate(time.Second)) && !t.After(started) {
			g.RunnerReplaced = true
		}
	}

	return g
}

// daemonSetPace is the DaemonSet controller's pace on the kube-proxy
// rollout, the cluster's own: the median time between two kube-proxy pods
// starting on the target (the controller sees one Ready, deletes the next
// old pod, waits for it to go and creates its replacement, which starts).
// Zero with fewer than two starts.
func daemonSetPace(evs []events.Event) time.Duration {
	var starts []time.Time

	for _, e := range evs {
		if e.Component == events.KubeProxy && e.Version == toVersion {
			starts = append(starts, e.Time)
		}
	}

	slices.SortFunc(starts, time.Time.Compare)

	var steps []float64

	for i := 1; i < len(starts); i++ {
		steps = append(steps, starts[i].Sub(starts[i-1]).Seconds())
	}

	return time.Duration(spread(steps).Median * float64(time.Second))
}

// rolloutDone is when the last kube-proxy pod at the target got Ready.
func rolloutDone(evs []events.Event) time.Time {
	var at time.Time

	for _, e := range evs {
		if e.Component == events.KubeProxy && e.Version == toVersion {
			at = later(at, e.Time.Add(benchLatencies.Ready))
		}
	}

	return at
}

func later(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}

	return a
}

func tagOf(image string) string {
	if i := strings.LastIndex(image, ":"); i >= 0 && !strings.Contains(image[i:], "/") {
		return image[i+1:]
	}

	return image
}
