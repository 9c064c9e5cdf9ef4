package plugin

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"golang.org/x/term"
	"k8s.io/cli-runtime/pkg/genericiooptions"

	api "github.com/ichor-dev/kubectl-ichor/pkg/api/v1alpha1"
	"github.com/ichor-dev/kubectl-ichor/pkg/engine"
	"github.com/ichor-dev/kubectl-ichor/pkg/job"
	"github.com/ichor-dev/kubectl-ichor/pkg/progress"
)

// view renders an operation for a person: a header, the current stage with a bar, one
// line per node of the stage (the plan's order), the stage's own step, and how it ended
// or what is wrong.
type view struct {
	op      *api.Operation
	plan    *api.Plan
	now     time.Time
	problem string
}

const barWidth = 18

// removeTimeout bounds the follower's removal of a copied talosconfig.
const removeTimeout = 15 * time.Second

// jobEndTimeout bounds the follower's wait, once the operation succeeded, for its Job
// to end (awaitJobEnd).
const jobEndTimeout = 30 * time.Second

// frame is the view as lines.
func (v view) frame() []string {
	op := v.op
	s := op.Status

	lines := []string{fmt.Sprintf("Operation %s: %s to %s  %s  %s%s", op.Spec.ID, kindTitle(op.Spec.Upgrade), op.Spec.Target,
		s.Phase, duration(v.elapsed()), v.runner())}

	if line := hopLine(op); line != "" {
		if left := v.pathLeft(); left != "" {
			line += "; " + left
		}

		lines = append(lines, line)
	}

	switch {
	case s.StageIndex == 0 && !s.Phase.Finished():
		lines = append(lines, fmt.Sprintf("  waiting for the runner (job %s)", s.Job))
	case s.StageIndex > 0:
		rows := v.rows()
		done := 0

		for _, r := range rows {
			if r.phase == engine.PhaseDone || r.phase == engine.PhaseHeld {
				done++
			}
		}

		lines = append(lines, fmt.Sprintf("Stage %d/%d %s  %s %d/%d", s.StageIndex, s.StageCount, s.Stage, bar(done, len(rows)), done, len(rows)))

		width := 0
		for _, r := range rows {
			width = max(width, len(r.node))
		}

		for _, r := range rows {
			line := fmt.Sprintf("  %-*s  %-10s", width, r.node, r.phase)
			if r.message != "" {
				line += "  " + r.message
			}

			if !r.since.IsZero() && inProgress(r.phase) && s.Phase == api.PhaseRunning {
				line += "  (" + duration(v.now.Sub(r.since)) + ")"
			}

			lines = append(lines, strings.TrimRight(line, " "))
		}

		if s.Step != "" {
			lines = append(lines, "  "+s.Step)
		}

		if line := v.progressLine(); line != "" {
			lines = append(lines, line)
		}
	}

	switch s.Phase {
	case api.PhasePaused:
		lines = append(lines, "Paused: "+pauseWhere(op)+s.Reason)
		if s.Action != "" {
			lines = append(lines, "  what to do: "+s.Action)
		}
	case api.PhaseAborted:
		lines = append(lines, "Aborted: "+s.Reason)
	case api.PhaseSucceeded:
		if s.Manifests != "" {
			lines = append(lines, "  bootstrap manifests: "+s.Manifests)
		}

		lines = append(lines, fmt.Sprintf("Succeeded in %s", duration(v.elapsed())))
	}

	if v.problem != "" {
		lines = append(lines, "! "+v.problem)
	}

	return lines
}

// progressLine is the whole operation's nodes done and the time left, when
// the plan is known and the operation runs.
func (v view) progressLine() string {
	if v.plan == nil || v.op.Status.Phase.Finished() {
		return ""
	}

	p := progress.Of(v.op, v.plan, v.now)
	if p.Total == 0 {
		return ""
	}

	left := "estimating the time left (after the first nodes)"

	switch {
	case v.op.Status.Phase != api.PhaseRunning:
		return fmt.Sprintf("Overall %d/%d node steps, %s elapsed", p.Done, p.Total, duration(time.Duration(p.ElapsedSeconds)*time.Second))
	case p.RemainingSeconds != nil:
		left = "about " + duration(time.Duration(*p.RemainingSeconds)*time.Second) + " left"
	}

	return fmt.Sprintf("Overall %d/%d node steps, %s elapsed, %s", p.Done, p.Total, duration(time.Duration(p.ElapsedSeconds)*time.Second), left)
}

// pathLeft is a running path's time left, or what its estimate waits for.
func (v view) pathLeft() string {
	if v.op.Status.Phase != api.PhaseRunning {
		return ""
	}

	p := progress.Of(v.op, v.plan, v.now).Path

	switch {
	case p == nil:
		return ""
	case p.RemainingSeconds != nil:
		return "about " + duration(time.Duration(*p.RemainingSeconds)*time.Second) + " left for the path"
	}

	return p.Basis
}

func (v view) elapsed() time.Duration { return progress.Elapsed(v.op, v.now) }

func (v view) runner() string {
	s := v.op.Status
	if s.Runner == "" || s.Phase != api.PhaseRunning {
		return ""
	}

	return fmt.Sprintf("  (pod %s, run %d)", s.Runner, s.Runs)
}

type row struct {
	node    string
	phase   engine.NodePhase
	message string
	since   time.Time
}

// rows are the current stage's nodes: the plan's, in its order, then any other the
// engine reported in this stage.
func (v view) rows() []row {
	s := v.op.Status

	var names []string

	seen := map[string]bool{}

	if v.plan != nil {
		for _, st := range v.plan.Stages {
			if st.Name != s.Stage {
				continue
			}

			for _, n := range st.Nodes {
				names = append(names, n.Node)
				seen[n.Node] = true
			}
		}
	}

	for _, n := range s.Nodes {
		if n.Stage == s.Stage && !seen[n.Name] {
			names = append(names, n.Name)
			seen[n.Name] = true
		}
	}

	rows := make([]row, 0, len(names))

	for _, name := range names {
		r := row{node: name, phase: engine.PhasePending}

		if n := s.Node(name); n != nil && n.Stage == s.Stage {
			r.phase, r.message, r.since = engine.NodePhase(n.Phase), n.Message, n.Since.Time
		}

		rows = append(rows, r)
	}

	return rows
}

// inProgress reports whether a node is in the middle of a step (its time in it is shown).
func inProgress(p engine.NodePhase) bool {
	switch p {
	case engine.PhaseCordoned, engine.PhaseDraining, engine.PhaseApplying, engine.PhaseUpgrading, engine.PhaseVerifying:
		return true
	}

	return false
}

func pauseWhere(op *api.Operation) string {
	s := op.Status

	where := s.Stage
	if s.PausedNode != "" {
		where += " " + s.PausedNode
	}

	if where == "" {
		return ""
	}

	return where + ": "
}

func bar(done, total int) string {
	if total == 0 {
		return "[" + strings.Repeat("-", barWidth) + "]"
	}

	n := done * barWidth / total

	return "[" + strings.Repeat("#", n) + strings.Repeat("-", barWidth-n) + "]"
}

func kindTitle(upgrade string) string {
	switch upgrade {
	case api.UpgradeTalos:
		return "Talos"
	case api.UpgradeCluster:
		return "Path"
	}

	return "Kubernetes"
}

// hopLine says where a path is: the hop under way (or the last done, and the next), ""
// for an operation that is not a path.
func hopLine(op *api.Operation) string {
	path := op.Spec.Runs()
	if op.Spec.Upgrade != api.UpgradeCluster || len(path) == 0 {
		return ""
	}

	done := len(op.Status.HopsDone())
	n := max(op.Status.Hop, 1)
	hop := path[min(n, len(path))-1]

	switch {
	case done == len(path):
		return fmt.Sprintf("Hops %d/%d done", done, len(path))
	case op.Status.NextHop() > n:
		return fmt.Sprintf("Hop %d/%d %s done; next: hop %d/%d %s", n, len(path), hop.Label(), n+1, len(path), path[n].Label())
	case op.Status.Hop == 0:
		return fmt.Sprintf("Hop 1/%d %s (not started)", len(path), hop.Label())
	}

	return fmt.Sprintf("Hop %d/%d %s  (%d done)", n, len(path), hop.Label(), done)
}

// duration prints a duration as 1h02m03s, 4m05s or 6s.
func duration(d time.Duration) string {
	d = max(d, 0).Truncate(time.Second)
	h, m, s := int(d.Hours()), int(d.Minutes())%60, int(d.Seconds())%60

	switch {
	case h > 0:
		return fmt.Sprintf("%dh%02dm%02ds", h, m, s)
	case m > 0:
		return fmt.Sprintf("%dm%02ds", m, s)
	}

	return fmt.Sprintf("%ds", s)
}

// viewChanges are the plain lines that say what changed from prev to cur (prev nil: the
// first look).
func viewChanges(prev, cur view) []string {
	var out []string

	p, c := prev.op, cur.op

	active := c.Status.Phase == api.PhasePending || c.Status.Phase == api.PhaseRunning
	if active && (p == nil || p.Status.Phase != c.Status.Phase || p.Status.Runner != c.Status.Runner) {
		line := fmt.Sprintf("operation %s: %s", c.Spec.ID, c.Status.Phase)

		switch {
		case c.Status.Phase == api.PhaseRunning && c.Status.Runner != "":
			line += fmt.Sprintf(" (runner pod %s, run %d)", c.Status.Runner, c.Status.Runs)
		case c.Status.Phase == api.PhasePending && c.Status.Job != "":
			line += fmt.Sprintf(" (job %s)", c.Status.Job)
		}

		out = append(out, line)
	}

	if c.Status.StageIndex > 0 && (p == nil || p.Status.StageIndex != c.Status.StageIndex || p.Status.Stage != c.Status.Stage) {
		out = append(out, fmt.Sprintf("Stage %d/%d %s", c.Status.StageIndex, c.Status.StageCount, c.Status.Stage))

		// The whole operation's progress, once a stage: a line per step would
		// drown the steps.
		if line := cur.progressLine(); line != "" {
			out = append(out, line)
		}
	}

	for _, n := range c.Status.Nodes {
		var old *api.NodeStatus
		if p != nil {
			old = p.Status.Node(n.Name)
		}

		if old != nil && old.Stage == n.Stage && old.Phase == n.Phase && old.Message == n.Message {
			continue
		}

		line := fmt.Sprintf("  %s %s", n.Name, n.Phase)
		if n.Message != "" {
			line += ": " + n.Message
		}

		out = append(out, line)
	}

	if c.Status.Step != "" && (p == nil || p.Status.Step != c.Status.Step) {
		out = append(out, "  "+c.Status.Step)
	}

	if p == nil || p.Status.Phase != c.Status.Phase {
		switch c.Status.Phase {
		case api.PhasePaused:
			out = append(out, "Paused: "+pauseWhere(c)+c.Status.Reason)
			if c.Status.Action != "" {
				out = append(out, "  what to do: "+c.Status.Action)
			}
		case api.PhaseAborted:
			out = append(out, "Aborted: "+c.Status.Reason)
		case api.PhaseSucceeded:
			out = append(out, fmt.Sprintf("Succeeded in %s", duration(cur.elapsed())))
		}
	}

	if cur.problem != "" && cur.problem != prev.problem {
		out = append(out, "! "+cur.problem)
	}

	return out
}

// follower follows an operation until it ends: a live view on a terminal, plain lines
// otherwise. Ctrl-C (ctx) detaches.
type follower struct {
	genericiooptions.IOStreams

	ctl  *job.Control
	live bool
	poll time.Duration
	now  func() time.Time
	// jsonLines prints, instead of the view, the status document (the
	// Operation with its progress) on one line each time it changes.
	jsonLines bool
	lastLine  string
}

// run follows until the operation succeeds (nil), pauses, is aborted or its Job fails
// (an error with the exit code to use), or ctx ends (detached).
func (f *follower) run(ctx context.Context) error {
	var (
		prev      view
		shown     int
		diagnosed time.Time
	)

	stored, err := storedPlan(ctx, f.ctl)
	if err != nil {
		return err
	}

	// The state is watched from before it is first read, so that a change wakes
	// the follower at once (an ended operation is said when it ends); the poll
	// stays for a watch refused or ended, and to diagnose the Job's pods.
	wake := f.ctl.WatchState(ctx)
	defer wake.Stop()

	for {
		op, err := f.ctl.Get(ctx)

		if ctx.Err() != nil {
			return f.detach(op)
		}

		var corrupt *job.CorruptStateError
		if errors.As(err, &corrupt) || errors.Is(err, job.ErrNoOperation) {
			return err
		}

		cur := view{op: op, plan: stored.planOf(op), now: f.now()}

		if err != nil {
			// The API may be away a moment (an apiserver restarting): keep looking.
			cur = prev
			cur.now = f.now()
			cur.problem = "cannot read the state: " + err.Error() + " (trying again)"
		} else if time.Since(diagnosed) >= 3*f.poll || prev.problem != "" {
			diagnosed = time.Now()

			if p, derr := f.ctl.Diagnose(ctx, op); derr == nil && p != nil {
				cur.problem = p.Message
				if p.Final {
					f.show(&shown, prev, cur)

					return &exitError{code: ExitError, err: errors.New(p.Message)}
				}
			}
		}

		if cur.op != nil {
			f.show(&shown, prev, cur)
			prev = cur
		}

		if op != nil && err == nil {
			if done, result := outcome(op, f.ctl.Namespace); done {
				if result == nil {
					f.awaitJobEnd(ctx, op)
				}

				f.removeCopiedTalosconfig(ctx, op)

				return result
			}
		}

		if wake.Next(ctx, f.poll); ctx.Err() != nil {
			return f.detach(prev.op)
		}
	}
}

// show draws the view: redrawn in place on a terminal, changed lines otherwise.
func (f *follower) show(shown *int, prev, cur view) {
	if f.jsonLines {
		f.showJSON(cur)

		return
	}

	if !f.live {
		for _, l := range viewChanges(prev, cur) {
			writef(f.Out, "%s\n", l)
		}

		return
	}

	width := 120
	if fd, ok := f.Out.(interface{ Fd() uintptr }); ok {
		if w, _, err := term.GetSize(int(fd.Fd())); err == nil && w > 20 {
			width = w
		}
	}

	var b strings.Builder

	if *shown > 0 {
		fmt.Fprintf(&b, "\x1b[%dA\x1b[J", *shown)
	}

	lines := cur.frame()
	for _, l := range lines {
		if len(l) >= width {
			l = l[:width-1]
		}

		b.WriteString(l + "\n")
	}

	*shown = len(lines)

	writef(f.Out, "%s", b.String())
}

// showJSON prints the status document on one line when it changed (the
// elapsed time aside: a line a second would say nothing new).
func (f *follower) showJSON(cur view) {
	doc := statusDocument{Operation: cur.op, Progress: progress.Of(cur.op, cur.plan, cur.now)}

	key := doc.Progress
	key.ElapsedSeconds, key.RemainingSeconds = 0, nil

	b, err := json.Marshal(struct {
		*api.Operation
		Progress progress.Progress `json:"progress"`
		Problem  string            `json:"problem,omitempty"`
	}{cur.op, key, cur.problem})
	if err != nil || string(b) == f.lastLine {
		return
	}

	f.lastLine = string(b)

	line, err := json.Marshal(doc)
	if err != nil {
		return
	}

	writef(f.Out, "%s\n", line)
}

// outcome says whether op has ended for a follower, and with what.
func outcome(op *api.Operation, namespace string) (bool, error) {
	n := nsFlag(namespace)

	switch op.Status.Phase {
	case api.PhaseSucceeded:
		return true, nil
	case api.PhasePaused:
		msg := fmt.Sprintf("operation %s paused: %s%s", op.Spec.ID, pauseWhere(op), op.Status.Reason)
		if op.Status.Action != "" {
			msg += ": " + op.Status.Action
		}

		switch {
		case strings.Contains(msg, "kubectl ichor resume"):
		case strings.HasSuffix(msg, "then resume"):
			msg = strings.TrimSuffix(msg, "resume") + "kubectl ichor resume" + n
		default:
			msg += "; then continue with kubectl ichor resume" + n
		}

		return true, &exitError{code: ExitPaused, err: errors.New(msg)}
	case api.PhaseAborted:
		return true, fmt.Errorf("operation %s was aborted (%s)", op.Spec.ID, op.Status.Reason)
	}

	return false, nil
}

// awaitJobEnd waits, bounded, for the Job of op, which succeeded, to end: its runner
// wrote Succeeded, then releases the lock and removes its credentials as it ends, so
// the follower returns once the operation is wholly over (another upgrade can start
// at once). A Job that does not end in time is a warning, not a failure.
func (f *follower) awaitJobEnd(ctx context.Context, op *api.Operation) {
	ended, err := f.ctl.WaitJobEnded(ctx, op.Status.Job, jobEndTimeout)
	if ended || ctx.Err() != nil {
		return
	}

	why := ""
	if err != nil {
		why = " (" + err.Error() + ")"
	}

	writef(f.ErrOut, "warning: operation %s succeeded, but its job %s has not ended after %s%s: its runner releases the lock and removes its credentials as it ends; kubectl ichor status%s shows it\n",
		op.Spec.ID, op.Status.Job, jobEndTimeout, why, nsFlag(f.ctl.Namespace))
}

// removeCopiedTalosconfig deletes, once op succeeded, the copy of the operator's
// talosconfig its launch put in the cluster: the runner deletes it as it ends, but
// a moment after the state says Succeeded, and "deleted when the operation ends" is
// what the launch promised. A failure is a warning naming what is left.
func (f *follower) removeCopiedTalosconfig(ctx context.Context, op *api.Operation) {
	if op.Status.Phase != api.PhaseSucceeded || op.Spec.Credentials != api.CredentialsLocal {
		return
	}

	dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), removeTimeout)
	defer cancel()

	if _, err := f.ctl.RemoveLocalTalosconfig(dctx); err != nil {
		writef(f.ErrOut, "warning: the copy of your talosconfig is left: %v; kubectl ichor abort%s removes it\n", err, nsFlag(f.ctl.Namespace))
	}
}

// detach says how to follow again and ends with ExitDetached.
func (f *follower) detach(op *api.Operation) error {
	what := "the operation"
	if op != nil {
		what = "operation " + op.Spec.ID
	}

	writef(f.ErrOut, "\nDetached: %s goes on in the cluster. Follow it again with: kubectl ichor status --watch%s\n", what, nsFlag(f.ctl.Namespace))

	return &exitError{code: ExitDetached, err: errors.New("detached"), silent: true}
}

// printOnce writes the view once (status without --watch).
func printOnce(w io.Writer, v view) {
	for _, l := range v.frame() {
		writef(w, "%s\n", l)
	}
}
