package progress

import (
	"fmt"
	"slices"
	"strings"
	"time"

	api "github.com/ichor-dev/kubectl-ichor/pkg/api/v1alpha1"
)

// Path is how far a path (an UpgradeCluster operation) has come over its hops.
type Path struct {
	// Hop is the number of the hop under way (or the last done); Hops how many the
	// path has; Done how many are done.
	Hop  int `json:"hop"`
	Hops int `json:"hops"`
	Done int `json:"done"`
	// RemainingSeconds is the estimated time left for the whole path; absent until
	// every kind of hop still to come has been measured (or, for the hop under way,
	// its plan gives an estimate), and when the path ended.
	RemainingSeconds *int64 `json:"remainingSeconds,omitempty"`
	// Basis says what the estimate was made from, or what it waits for.
	Basis string `json:"basis,omitempty"`
}

// OfPath estimates the time left of a path: the hop under way takes what its own
// estimate says (current, from Of with its plan) or else the median time of the hops of
// its kind done so far, less the time it has run; each hop after it the median time of
// the hops of its kind done so far. A hop is timed from its start to its end (a pause
// between hops is not in it). Nil for an operation that is not a path.
func OfPath(op *api.Operation, current Progress, now time.Time) *Path {
	runs := op.Spec.Runs()
	if op.Spec.Upgrade != api.UpgradeCluster || len(runs) == 0 {
		return nil
	}

	s := &op.Status
	p := &Path{Hop: max(s.Hop, 1), Hops: len(runs), Done: len(s.HopsDone())}

	if s.Phase.Finished() || p.Done == len(runs) {
		return p
	}

	measured := map[string][]time.Duration{}

	for _, h := range s.HopsDone() {
		measured[h.Upgrade] = append(measured[h.Upgrade], h.Done.Sub(h.Started.Time))
	}

	var (
		left    time.Duration
		missing []string
	)

	estimate := func(kind string) (time.Duration, bool) {
		d := measured[kind]
		if len(d) == 0 {
			if !slices.Contains(missing, kind) {
				missing = append(missing, kind)
			}

			return 0, false
		}

		return median(d), true
	}

	next := s.NextHop()

	if next == p.Hop && next <= len(runs) {
		kind := runs[next-1].Upgrade

		switch {
		case current.RemainingSeconds != nil:
			left += time.Duration(*current.RemainingSeconds) * time.Second
		default:
			if d, ok := estimate(kind); ok {
				left += max(0, d-hopRunning(s, next, now))
			}
		}

		next++
	}

	for n := next; n <= len(runs); n++ {
		if d, ok := estimate(runs[n-1].Upgrade); ok {
			left += d
		}
	}

	if len(missing) > 0 {
		p.Basis = "no estimate until a " + strings.Join(missing, " and a ") + " hop is measured"

		return p
	}

	secs := int64(left.Round(time.Second).Seconds())
	p.RemainingSeconds = &secs

	var kinds []string

	for _, kind := range []string{api.UpgradeTalos, api.UpgradeKubernetes} {
		if d := measured[kind]; len(d) > 0 {
			kinds = append(kinds, fmt.Sprintf("%s %s (%d measured)", kind, median(d).Round(time.Second), len(d)))
		}
	}

	p.Basis = "hops done: " + strings.Join(kinds, ", ")
	if current.RemainingSeconds != nil {
		p.Basis = "the hop under way's own estimate; " + p.Basis
	}

	return p
}

// hopRunning is how long hop number has run by now.
func hopRunning(s *api.OperationStatus, number int, now time.Time) time.Duration {
	for _, h := range s.Hops {
		if h.Number == number {
			return max(0, now.Sub(h.Started.Time))
		}
	}

	return 0
}
