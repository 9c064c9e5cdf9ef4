package plugin

import (
	"fmt"
	"sort"
	"strings"
	"time"

	api "github.com/ichor-dev/kubectl-ichor/pkg/api/v1alpha1"
	"github.com/ichor-dev/kubectl-ichor/pkg/job"
)

// summaryLines say what an ended operation did, node by node: each stage's
// time from its apply to done (or "verified" when it changed nothing), what
// the plan changed there, then every pause and its reason.
func summaryLines(op *api.Operation, plan *api.Plan) []string {
	s := op.Status
	if len(s.Nodes) == 0 {
		return nil
	}

	changed := map[string][]string{}

	if plan != nil {
		for _, st := range plan.Stages {
			for _, n := range st.Nodes {
				for _, c := range n.Changes {
					changed[n.Node] = appendOnce(changed[n.Node], c.Component)
				}
			}
		}
	}

	names := make([]string, 0, len(s.Nodes))
	width := 0

	for _, n := range s.Nodes {
		names = append(names, n.Name)
		width = max(width, len(n.Name))
	}

	sort.Strings(names)

	lines := []string{"Nodes, each stage from its apply to done:"}

	for _, name := range names {
		n := s.Node(name)

		var steps []string

		for _, t := range n.Timeline {
			switch {
			case t.Done == nil:
				steps = append(steps, t.Stage+" not done")
			case t.ApplyStarted == nil:
				steps = append(steps, t.Stage+" verified")
			default:
				steps = append(steps, fmt.Sprintf("%s %s", t.Stage, duration(t.Done.Sub(t.ApplyStarted.Time).Round(time.Second))))
			}
		}

		if len(steps) == 0 {
			steps = []string{"no stage done"}
		}

		line := fmt.Sprintf("  %-*s  %s", width, name, strings.Join(steps, ", "))
		if c := changed[name]; len(c) > 0 {
			line += "; changed " + strings.Join(c, ", ")
		}

		lines = append(lines, line)
	}

	if len(s.Pauses) > 0 {
		lines = append(lines, "Pauses:")

		for _, p := range s.Pauses {
			where := p.Stage
			if p.Node != "" {
				where += " " + p.Node
			}

			lines = append(lines, fmt.Sprintf("  %s  %s: %s", p.At.UTC().Format(time.DateTime), where, p.Reason))
		}
	}

	return lines
}

// historyLines list the ended operations kept, but the current one.
func historyLines(history []job.Record, current, namespace string) []string {
	var lines []string

	for _, rec := range history {
		op := rec.Operation
		if op.Spec.ID == current {
			continue
		}

		if lines == nil {
			lines = []string{fmt.Sprintf("Earlier (kubectl ichor status --operation <id>%s):", nsFlag(namespace))}
		}

		ended := ""
		if op.Status.FinishedAt != nil {
			ended = " " + op.Status.FinishedAt.UTC().Format(time.DateTime)
		}

		lines = append(lines, fmt.Sprintf("  %s  %s to %s  %s%s", op.Spec.ID, kindTitle(op.Spec.Upgrade), op.Spec.Target, op.Status.Phase, ended))
	}

	return lines
}

func appendOnce(list []string, s string) []string {
	for _, x := range list {
		if x == s {
			return list
		}
	}

	return append(list, s)
}
