package progress

import (
	"fmt"
	"slices"
	"strings"
	"time"

	api "github.com/ichor-dev/kubectl-ichor/pkg/api/v1alpha1"
)

// Measured are how long the upgrades of a cluster's ended operations took, by kind
// (api.UpgradeKubernetes, api.UpgradeTalos): each Succeeded plain operation, and each
// hop a path did. The time an operation waited for the operator (a pause, until its
// resume) is not in it.
type Measured map[string][]time.Duration

// MeasuredFrom measures ops (the namespace's history, the current state if it ended).
func MeasuredFrom(ops []*api.Operation) Measured {
	m := Measured{}

	for _, op := range ops {
		s := &op.Status

		if op.Spec.Upgrade == api.UpgradeCluster {
			for _, h := range s.HopsDone() {
				m[h.Upgrade] = append(m[h.Upgrade], worked(s, h.Started.Time, h.Done.Time))
			}

			continue
		}

		if s.Phase == api.PhaseSucceeded && s.StartedAt != nil && s.FinishedAt != nil {
			m[op.Spec.Upgrade] = append(m[op.Spec.Upgrade], worked(s, s.StartedAt.Time, s.FinishedAt.Time))
		}
	}

	return m
}

// worked is the time from..to less the time the operation waited for its operator in it
// (from a runner's end to the next runner after a resume).
func worked(s *api.OperationStatus, from, to time.Time) time.Duration {
	d := to.Sub(from)

	for _, r := range s.Runners {
		if !r.AfterPause {
			continue
		}

		start, end := later(from, r.Idle.Time), r.Started.Time
		if end.After(to) {
			end = to
		}

		if end.After(start) {
			d -= end.Sub(start)
		}
	}

	return max(0, d)
}

// Estimate is the median time of the upgrades of kind measured, and how many there
// were; false when none was.
func (m Measured) Estimate(kind string) (time.Duration, int, bool) {
	d := m[kind]
	if len(d) == 0 {
		return 0, 0, false
	}

	return median(d), len(d), true
}

// Basis says what estimates of kinds are made from: each kind's median and count, or
// that none of it was measured.
func (m Measured) Basis(kinds []string) string {
	var (
		have, lack []string
		seen       []string
	)

	for _, k := range kinds {
		if slices.Contains(seen, k) {
			continue
		}

		seen = append(seen, k)

		if d, n, ok := m.Estimate(k); ok {
			have = append(have, fmt.Sprintf("%s %s (median of %d)", k, d.Round(time.Second), n))
		} else {
			lack = append(lack, k)
		}
	}

	var parts []string

	if len(have) > 0 {
		parts = append(parts, "measured in this cluster's history: "+strings.Join(have, ", "))
	}

	if len(lack) > 0 {
		parts = append(parts, "no "+strings.Join(lack, " or ")+" upgrade in the history to measure")
	}

	return strings.Join(parts, "; ")
}
