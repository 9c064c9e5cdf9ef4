package progress

import (
	"fmt"
	"slices"
	"sort"
	"time"

	api "github.com/ichor-dev/kubectl-ichor/pkg/api/v1alpha1"
	"github.com/ichor-dev/kubectl-ichor/pkg/job"
)

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
	// (from the previous batch done to this one done), 0 when none was measured.
	BatchSeconds int64 `json:"batchSeconds,omitempty"`
}

// Of computes op's progress against plan at now. plan may be nil (the state
// holds no plan): then only the elapsed time is known.
func Of(op *job.Operation, plan *api.Plan, now time.Time) Progress {
	s := op.Status
	p := Progress{ElapsedSeconds: int64(Elapsed(op, now).Seconds())}

	if plan == nil {
		return p
	}

	var (
		remaining []pending // batches not done, every stage
		allCycles []time.Duration
		cyclesBy  = map[string][]time.Duration{}
		// lastDoneAll is when the last batch was done: the first batch's
		// cycle runs from the first runner's start.
		lastDoneAll time.Time
	)

	if s.StartedAt != nil {
		lastDoneAll = s.StartedAt.Time
	}

	for _, st := range plan.Stages {
		if st.Skipped {
			continue
		}

		ps := Stage{Name: st.Name, Total: len(st.Nodes)}

		// Batches in order, with when each was done (its last node's Done).
		var (
			batchDone = map[int]time.Time{}
			batchLeft = map[int]bool{}
			order     []int
		)

		for _, n := range st.Nodes {
			if !slices.Contains(order, n.Batch) {
				order = append(order, n.Batch)
			}

			done, ok := doneAt(&s, n.Node, st.Name)
			if !ok {
				batchLeft[n.Batch] = true

				continue
			}

			ps.Done++

			if done.After(batchDone[n.Batch]) {
				batchDone[n.Batch] = done
			}
		}

		ps.Batches = len(order)

		// A batch's cycle: from the previous batch done (or the previous
		// stage's last) to its own done.
		prev := lastDoneAll

		for _, b := range order {
			if batchLeft[b] {
				remaining = append(remaining, pending{stage: st.Name})

				continue
			}

			done := batchDone[b]
			if !prev.IsZero() && done.After(prev) {
				cyclesBy[st.Name] = append(cyclesBy[st.Name], done.Sub(prev))
				allCycles = append(allCycles, done.Sub(prev))
			}

			if done.After(prev) {
				prev = done
			}
		}

		if prev.After(lastDoneAll) {
			lastDoneAll = prev
		}

		if c := cyclesBy[st.Name]; len(c) > 0 {
			ps.BatchSeconds = int64(median(c).Seconds())
		}

		p.Done += ps.Done
		p.Total += ps.Total
		p.Stages = append(p.Stages, ps)
	}

	if s.Phase.Finished() || len(remaining) == 0 || len(allCycles) == 0 {
		return p
	}

	// Each batch left takes its stage's median cycle, or, for a stage not
	// measured yet, the median of the stages of its kind, or of all.
	var left time.Duration

	for _, r := range remaining {
		left += cycleFor(r.stage, cyclesBy, allCycles)
	}

	// The batch under way has been going since the last one was done.
	if !lastDoneAll.IsZero() && now.After(lastDoneAll) {
		left -= min(now.Sub(lastDoneAll), cycleFor(remaining[0].stage, cyclesBy, allCycles))
	}

	secs := int64(left.Round(time.Second).Seconds())
	p.RemainingSeconds = &secs
	p.Basis = basis(cyclesBy, len(allCycles))

	return p
}

type pending struct{ stage string }

// kinds groups the stages whose batches take alike: a static pod restart,
// a drain and kubelet restart, a drain and reboot.
var kinds = map[string]string{
	"APIServers": "static pods", "ControlPlaneComponents": "static pods", "KubeProxy": "static pods",
	"Kubelets": "drain", "TalosOS": "reboot",
}

func cycleFor(stage string, by map[string][]time.Duration, all []time.Duration) time.Duration {
	if c := by[stage]; len(c) > 0 {
		return median(c)
	}

	var alike []time.Duration

	for name, c := range by {
		if kinds[name] != "" && kinds[name] == kinds[stage] {
			alike = append(alike, c...)
		}
	}

	if len(alike) > 0 {
		return median(alike)
	}

	return median(all)
}

func basis(by map[string][]time.Duration, n int) string {
	names := make([]string, 0, len(by))
	for name := range by {
		names = append(names, name)
	}

	sort.Strings(names)

	out := fmt.Sprintf("%d batches measured, median per batch:", n)
	for _, name := range names {
		out += fmt.Sprintf(" %s %s", name, median(by[name]).Round(time.Second))
	}

	return out
}

// doneAt is when the node was done in stage, from its timeline.
func doneAt(s *job.OperationStatus, node, stage string) (time.Time, bool) {
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
func Elapsed(op *job.Operation, now time.Time) time.Duration {
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

func median(d []time.Duration) time.Duration {
	s := slices.Clone(d)
	slices.Sort(s)

	return s[len(s)/2]
}
