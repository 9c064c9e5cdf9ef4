package progress

import (
	"fmt"
	"math"
	"slices"
	"sort"
	"strings"
	"time"

	api "github.com/ichor-dev/kubectl-ichor/pkg/api/v1alpha1"
	"github.com/ichor-dev/kubectl-ichor/pkg/engine"
	"github.com/ichor-dev/kubectl-ichor/pkg/stages"
)

// JobFailureBackoff is the Job controller's delay before it replaces a
// failed pod (kube-controller-manager's DefaultJobPodFailureBackOff, not
// configurable). It counts the failures a podFailurePolicy ignores too, so
// the runner evicted by its own node's drain is replaced after it.
const JobFailureBackoff = 10 * time.Second

// Progress is how far an operation has come.
type Progress struct {
	// Stages are the plan's stages, in order, each with its nodes done.
	Stages []Stage `json:"stages"`
	// Done and Total count node visits over every stage (a node visited by
	// four stages counts four times).
	Done  int `json:"done"`
	Total int `json:"total"`
	// ElapsedSeconds is the time since the first runner started (or the
	// launch), to the end when the operation ended.
	ElapsedSeconds int64 `json:"elapsedSeconds"`
	// RemainingSeconds is the estimated time left; absent until one batch of
	// nodes has been measured, and when the operation ended.
	RemainingSeconds *int64 `json:"remainingSeconds,omitempty"`
	// Basis says what the estimate was made from.
	Basis string `json:"basis,omitempty"`
	// Path is how far a path has come over its hops (an UpgradeCluster operation; the
	// fields above are then its current hop's).
	Path *Path `json:"path,omitempty"`
}

// Stage is one stage's nodes done.
type Stage struct {
	// Name is the stage's name.
	Name string `json:"name"`
	// Done counts the stage's nodes done; Total its nodes.
	Done  int `json:"done"`
	Total int `json:"total"`
	// Batches counts the stage's batches (groups of nodes that move together).
	Batches int `json:"batches"`
	// BatchSeconds is the measured median time of one of the stage's batches
	// (from the previous batch done to this one done, the time without a
	// runner and the stage's rollout left out), 0 when none was measured.
	BatchSeconds int64 `json:"batchSeconds,omitempty"`
}

// Of computes op's progress against plan at now. plan may be nil (the state
// holds no plan): then only the elapsed time is known.
//
// The time left is the plan's critical path, made of what is still to come,
// in order:
//   - each batch of nodes left takes the median cycle measured for a batch
//     of its stage (from the previous batch done to its own done, without
//     the time the operation had no runner and without the rollout), else
//     of the stages of the same work (stages.Work), else of all;
//   - the DaemonSet rollout after a stage (kube-proxy after KubeProxy): its
//     pods not updated yet, MaxUnavailable at a time, each batch of pods at
//     the pace the rollout has shown since the first manifest sync changed
//     the DaemonSet; before it shows one, at the pace of a pod's start on
//     this cluster as the first runner's showed it (launch to lock);
//   - the runner's replacement, once, before the batch that drains the node
//     the runner runs on (or, when its pod stays on its node for want of
//     another, reboots it): the median of the replacements measured, else
//     that pod start when the runner hands over to a successor, plus the
//     Job's failure backoff when it stays on its node through the reboot.
//
// The item under way has been going since the last batch or step done (a
// rollout: since it was last observed).
//
// For a path, Path estimates the rest of the path (OfPath).
func Of(op *api.Operation, plan *api.Plan, now time.Time) Progress {
	p := of(op, plan, now)
	p.Path = OfPath(op, p, now)

	return p
}

func of(op *api.Operation, plan *api.Plan, now time.Time) Progress {
	s := &op.Status
	p := Progress{ElapsedSeconds: int64(Elapsed(op, now).Seconds())}

	if plan == nil {
		return p
	}

	m := newModel(op, plan, now)

	for i := range plan.Stages {
		st := &plan.Stages[i]
		if st.Skipped {
			continue
		}

		ps := m.stage(st)
		p.Done += ps.Done
		p.Total += ps.Total
		p.Stages = append(p.Stages, ps)
	}

	if s.Phase.Finished() || len(m.items) == 0 || len(m.all) == 0 {
		return p
	}

	var left time.Duration

	first, floor := m.items[0], m.unmeasuredFloor()

	for i, it := range m.items {
		d := it.dur(m)

		switch {
		case i == 0:
			d = max(0, d-it.underway(m))
		case it.sameKind(first):
			d = max(d, floor)
		}

		left += d
	}

	secs := int64(left.Round(time.Second).Seconds())
	p.RemainingSeconds = &secs
	p.Basis = m.basis()

	return p
}

// model is the operation's measured timeline against the plan.
type model struct {
	op   *api.Operation
	plan *api.Plan
	now  time.Time

	// idle are the intervals the operation had no runner; rollouts those
	// of the DaemonSet rollouts: neither is in a batch's cycle.
	idle, rollouts []interval
	// idleSince is when the last runner ended, with none after it yet.
	idleSince time.Time
	// prev is when the last batch was done, over every stage so far (the
	// first batch's cycle runs from the first runner's start); mark the
	// latest batch or step done, or runner start: what is under way has been
	// going since.
	prev, mark time.Time

	byStage map[string][]time.Duration
	// byWorkers are the stages' worker batches: a control plane's batch may wait
	// for more (in Kubelets, the static pods its new kubelet restarts).
	byWorkers map[string][]time.Duration
	byWork    map[stages.Work][]time.Duration
	all       []time.Duration

	// runnerNode is the node the current runner runs on (the plan's self
	// node when no runner was recorded).
	runnerNode string

	items []item
	// notes say what the rollout's and the replacement's times came from.
	notes []string
}

type interval struct{ from, to time.Time }

func newModel(op *api.Operation, plan *api.Plan, now time.Time) *model {
	s := &op.Status
	m := &model{
		op: op, plan: plan, now: now,
		byStage: map[string][]time.Duration{}, byWorkers: map[string][]time.Duration{}, byWork: map[stages.Work][]time.Duration{},
	}

	if s.StartedAt != nil {
		m.prev, m.mark = s.StartedAt.Time, s.StartedAt.Time
	}

	// The first runner's start to the microsecond, when recorded.
	if firstRunner(s) {
		m.prev = s.Runners[0].Started.Time
	}

	for i, r := range s.Runners {
		if i > 0 {
			m.idle = append(m.idle, interval{r.Idle.Time, r.Started.Time})
		}

		m.mark = later(m.mark, r.Started.Time)
		m.runnerNode = r.Node
	}

	// A runner that ended, with none after it yet: idle since.
	if n := len(s.Runners); n > 0 && s.Runners[n-1].Ended != nil && !s.Phase.Finished() {
		m.idleSince = s.Runners[n-1].Ended.Time
		m.idle = append(m.idle, interval{m.idleSince, now})
	}

	for _, r := range s.Steps {
		if r.Step == engine.StepRollout {
			end := now
			if r.Done != nil {
				end = r.Done.Time
			}

			m.rollouts = append(m.rollouts, interval{r.Started.Time, end})
		}

		if r.Done != nil {
			m.mark = later(m.mark, r.Done.Time)
		}
	}

	if m.runnerNode == "" {
		for _, st := range plan.Stages {
			for _, n := range st.Nodes {
				if n.Self {
					m.runnerNode = n.Node
				}
			}
		}
	}

	return m
}

// busy is the time from a to b with a runner, and without a rollout when
// rollouts is true.
func (m *model) busy(a, b time.Time, rollouts bool) time.Duration {
	d := b.Sub(a)

	// The intervals may overlap (a rollout without a runner): cut b - a
	// into the pieces outside every one.
	out := slices.Clone(m.idle)
	if rollouts {
		out = append(out, m.rollouts...)
	}

	slices.SortFunc(out, func(x, y interval) int { return x.from.Compare(y.from) })

	cur := a

	for _, iv := range out {
		from, to := later(cur, iv.from), iv.to
		if b.Before(to) {
			to = b
		}

		if to.After(from) {
			d -= to.Sub(from)
			cur = to
		}
	}

	return max(0, d)
}

// stage measures the stage's batches done and queues what is left of it.
func (m *model) stage(st *api.Stage) Stage {
	s := &m.op.Status
	ps := Stage{Name: st.Name, Total: len(st.Nodes)}
	work := stages.StageWork(st.Name)

	// Batches are judged by how many nodes of their role are done, not by which:
	// the runner orders the nodes again at the stage's start, its own node last,
	// so a batch of the plan may end in pieces while the next one's nodes end
	// with it. The i-th batch of a role is done once as many of the role's nodes
	// are done as the plan's batches up to it hold, at the moment the last of
	// those was.
	var (
		order      []int
		size       = map[int]int{}
		workers    = map[int]bool{} // a batch of workers (a batch holds one role)
		doneBy     = map[bool][]time.Time{}
		runnerLeft = map[bool]bool{} // the runner's node is still to come, by role
	)

	for _, n := range st.Nodes {
		if !slices.Contains(order, n.Batch) {
			order = append(order, n.Batch)
		}

		worker := n.Role == api.RoleWorker
		workers[n.Batch] = worker
		size[n.Batch]++

		done, ok := doneAt(s, n.Node, st.Name)
		if !ok {
			runnerLeft[worker] = runnerLeft[worker] || n.Node == m.runnerNode

			continue
		}

		ps.Done++

		doneBy[worker] = append(doneBy[worker], done)
	}

	for _, times := range doneBy {
		slices.SortFunc(times, time.Time.Compare)
	}

	var (
		batchDone = map[int]time.Time{}
		batchLeft = map[int]bool{}
		lastLeft  = map[bool]int{} // the last batch left, by role: the runner's node's
		upTo      = map[bool]int{} // the role's nodes in the plan's batches so far
	)

	for _, b := range order {
		worker := workers[b]
		upTo[worker] += size[b]

		if times := doneBy[worker]; len(times) >= upTo[worker] {
			batchDone[b] = times[upTo[worker]-1]
		} else {
			batchLeft[b], lastLeft[worker] = true, b
		}
	}

	ps.Batches = len(order)

	for _, b := range order {
		if batchLeft[b] {
			if runnerLeft[workers[b]] && lastLeft[workers[b]] == b && m.replaced(work) {
				m.items = append(m.items, item{kind: itemReplacement})
			}

			m.items = append(m.items, item{kind: itemBatch, stage: st.Name, work: work, workers: workers[b]})

			continue
		}

		done := batchDone[b]
		if !m.prev.IsZero() && done.After(m.prev) {
			if c := m.busy(m.prev, done, true); c > 0 {
				m.byStage[st.Name] = append(m.byStage[st.Name], c)
				m.byWork[work] = append(m.byWork[work], c)

				if workers[b] {
					m.byWorkers[st.Name] = append(m.byWorkers[st.Name], c)
				}
				m.all = append(m.all, c)
			}
		}

		m.prev = later(m.prev, done)
		m.mark = later(m.mark, done)
	}

	if r := m.rolloutOf(st); r != nil {
		rec := s.StepOf(st.Name, engine.StepRollout)
		if rec == nil || rec.Done == nil {
			it := item{kind: itemRollout, stage: st.Name, rollout: *r, rec: rec}
			if rec != nil && rec.Observed != nil {
				it.mark = rec.Observed.Time
			}

			m.items = append(m.items, it)
		}
	}

	if c := m.byStage[st.Name]; len(c) > 0 {
		ps.BatchSeconds = int64(median(c).Seconds())
	}

	return ps
}

// rolloutOf is the rollout that follows the stage, nil for none: the plan's,
// or for a plan made before plans carried it, the kube-proxy DaemonSet on
// every node, one pod at a time, when the KubeProxy stage moves kube-proxy.
func (m *model) rolloutOf(st *api.Stage) *api.Rollout {
	if st.Rollout != nil {
		return st.Rollout
	}

	if st.Name != (stages.KubeProxy{}).Name() {
		return nil
	}

	for _, n := range st.Nodes {
		for _, c := range n.Changes {
			if c.Component == "kube-proxy" {
				return &api.Rollout{Pods: m.plan.Cluster.ControlPlanes + m.plan.Cluster.Workers, MaxUnavailable: 1}
			}
		}
	}

	return nil
}

type itemKind int

const (
	itemBatch itemKind = iota
	itemRollout
	itemReplacement
)

// item is one thing left on the critical path.
type item struct {
	kind  itemKind
	stage string
	work  stages.Work
	// workers says a batch is of workers.
	workers bool
	// rollout and rec are the rollout's pods and its record, if any.
	rollout api.Rollout
	rec     *api.StepRecord
	// mark is when the item's own measure was taken (a rollout's last
	// observation); zero: the model's mark.
	mark time.Time
}

// underway is how long the item, first of those left, has been going.
func (it item) underway(m *model) time.Duration {
	switch {
	case it.kind == itemReplacement:
		// The replacement is the time without a runner.
		if !m.idleSince.IsZero() {
			return m.now.Sub(m.idleSince)
		}

		return 0
	case it.kind == itemRollout && !it.mark.IsZero():
		return m.busy(it.mark, m.now, false)
	case m.mark.IsZero() || !m.now.After(m.mark):
		return 0
	}

	return m.busy(m.mark, m.now, true)
}

func (it item) dur(m *model) time.Duration {
	switch it.kind {
	case itemRollout:
		return m.rolloutLeft(it)
	case itemReplacement:
		return m.replacement()
	default:
		return m.cycleFor(it.stage, it.work, it.workers)
	}
}

// unmeasuredFloor is what the batch under way says of its kind when no batch
// of its kind is measured yet. Such a batch is priced at another kind's pace
// (a Talos upgrade's first batch of workers at its control planes', whose
// drains evict nothing); once it has run longer than that, the batches of its
// kind after it are taken to last at least as long as it has run. Without it,
// with pods that took 2 s to stop, the estimate at half of the Talos benchmark
// was 36% short. 0 when the item under way is no batch or its kind has a pace
// of its own.
func (m *model) unmeasuredFloor() time.Duration {
	it := m.items[0]
	if it.kind != itemBatch {
		return 0
	}

	if it.workers && len(m.byWorkers[it.stage]) > 0 || !it.workers && len(m.byStage[it.stage]) > 0 {
		return 0
	}

	return it.underway(m)
}

// sameKind says whether two items are batches of the same stage and role.
func (it item) sameKind(o item) bool {
	return it.kind == itemBatch && o.kind == itemBatch && it.stage == o.stage && it.workers == o.workers
}

// cycleFor is a batch's time: its stage's median cycle, else that of the
// stages of its work, else that of all. A batch of workers takes that of its
// stage's worker batches once one is measured, and until then that of all
// batches, not its stage's control planes': theirs may hold more (the static
// pods a control plane's new kubelet restarts).
func (m *model) cycleFor(stage string, work stages.Work, workers bool) time.Duration {
	if workers {
		if c := m.byWorkers[stage]; len(c) > 0 {
			return median(c)
		}

		if len(m.all) > 0 && len(m.byStage[stage]) > 0 {
			return median(m.all)
		}
	}

	if c := m.byStage[stage]; len(c) > 0 {
		return median(c)
	}

	if c := m.byWork[work]; work != "" && len(c) > 0 {
		return median(c)
	}

	return median(m.all)
}

// firstRunner reports whether the status still holds the first runner's
// record (it keeps the last job.MaxRunners).
func firstRunner(s *api.OperationStatus) bool {
	return len(s.Runners) > 0 && len(s.Runners) >= s.Runs
}

// podStart is a pod's start on this cluster as the first runner's showed it:
// from the operation's launch to that runner taking the lock; 0 when unknown.
func (m *model) podStart() time.Duration {
	s := &m.op.Status
	if firstRunner(s) && s.Runners[0].Started.After(s.Runners[0].Idle.Time) {
		return s.Runners[0].Started.Sub(s.Runners[0].Idle.Time)
	}

	if s.StartedAt != nil && s.StartedAt.After(m.op.Spec.CreatedAt.Time) {
		return s.StartedAt.Sub(m.op.Spec.CreatedAt.Time)
	}

	return 0
}

// rolloutLeft is the rollout's time left as of its last observation.
func (m *model) rolloutLeft(it item) time.Duration {
	pods, updated, mu := it.rollout.Pods, 0, it.rollout.MaxUnavailable

	var perBatch time.Duration

	if r := it.rec; r != nil && r.Observed != nil && r.Pods > 0 {
		pods, updated, mu = r.Pods, min(r.Updated, r.Pods), max(1, r.MaxUnavailable)

		// The rollout began when the first manifest sync changed the
		// DaemonSet (the control planes' syncs overlap it), else when its
		// wait began.
		began := r.Started.Time
		if ms := m.op.Status.StepOf(it.stage, engine.StepManifests); ms != nil && ms.Started.Time.Before(began) {
			began = ms.Started.Time
		}

		if updated > 0 && r.Observed.After(began) {
			perBatch = time.Duration(float64(r.Observed.Sub(began)) * float64(mu) / float64(updated))
			m.note(fmt.Sprintf("rollout %d of %d pods left at %s per %d measured", pods-updated, pods, perBatch.Round(100*time.Millisecond), mu))
		}
	}

	if perBatch == 0 {
		perBatch = m.podStart()
		m.note(fmt.Sprintf("rollout %d of %d pods left at %s per %d (a pod's start, the runner's)", pods-updated, pods, perBatch.Round(100*time.Millisecond), max(1, mu)))
	}

	batches := math.Ceil(float64(max(0, pods-updated)) / float64(max(1, mu)))

	return time.Duration(batches * float64(perBatch))
}

// replaced says whether a batch of work on the runner's node replaces the
// runner: only a reboot does (its drain evicts the runner first, or the
// reboot takes down a runner that stays on its node); a kubelet restart
// leaves its container running.
func (m *model) replaced(work stages.Work) bool {
	return work.Reboots()
}

// replacement is the runner's replacement after its node's drain: the
// median of those measured (a runner that took over from one stopped, not
// paused), else a pod's start for a runner that hands over, and the Job's
// failure backoff and a pod's start for one that stays on its node.
func (m *model) replacement() time.Duration {
	var measured []time.Duration

	for i, r := range m.op.Status.Runners {
		if i > 0 && !r.AfterPause && r.Started.After(r.Idle.Time) {
			measured = append(measured, r.Started.Sub(r.Idle.Time))
		}
	}

	if len(measured) > 0 {
		d := median(measured)
		m.note(fmt.Sprintf("runner replacement %s measured", d.Round(100*time.Millisecond)))

		return d
	}

	// A runner that can leave its node hands over to a successor pod the Job starts
	// at once (no failure, no backoff); one that stays on it dies with the reboot, and
	// the Job replaces it after its failure backoff.
	if n := len(m.op.Status.Runners); n > 0 && !m.op.Status.Runners[n-1].StaysOnNode {
		d := m.podStart()
		m.note(fmt.Sprintf("runner hand-over %s (a pod's start)", d.Round(100*time.Millisecond)))

		return d
	}

	d := JobFailureBackoff + m.podStart()
	m.note(fmt.Sprintf("runner replacement %s (the Job's backoff and a pod's start)", d.Round(100*time.Millisecond)))

	return d
}

func (m *model) note(s string) {
	if !slices.Contains(m.notes, s) {
		m.notes = append(m.notes, s)
	}
}

func (m *model) basis() string {
	names := make([]string, 0, len(m.byStage))
	for name := range m.byStage {
		names = append(names, name)
	}

	sort.Strings(names)

	out := fmt.Sprintf("%d batches measured, median per batch:", len(m.all))
	for _, name := range names {
		out += fmt.Sprintf(" %s %s", name, median(m.byStage[name]).Round(100*time.Millisecond))
	}

	if len(m.notes) > 0 {
		out += "; " + strings.Join(m.notes, "; ")
	}

	return out
}

// doneAt is when the node was done in stage, from its timeline.
func doneAt(s *api.OperationStatus, node, stage string) (time.Time, bool) {
	n := s.Node(node)
	if n == nil {
		return time.Time{}, false
	}

	for _, t := range n.Timeline {
		if t.Stage == stage && t.Done != nil {
			return t.Done.Time, true
		}
	}

	return time.Time{}, false
}

// Elapsed is the operation's time so far: from the first runner's start (or
// the launch) to its end, or to now while it has not ended.
func Elapsed(op *api.Operation, now time.Time) time.Duration {
	start := op.Spec.CreatedAt.Time
	if op.Status.StartedAt != nil {
		start = op.Status.StartedAt.Time
	}

	end := now
	if op.Status.FinishedAt != nil {
		end = op.Status.FinishedAt.Time
	}

	return max(0, end.Sub(start))
}

func later(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}

	return a
}

func median(d []time.Duration) time.Duration {
	s := slices.Clone(d)
	slices.Sort(s)

	return s[len(s)/2]
}
