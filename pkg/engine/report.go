package engine

import (
	"context"
	"fmt"

	"github.com/ichor-dev/kubectl-ichor/pkg/discovery"
	"github.com/ichor-dev/kubectl-ichor/pkg/text"
)

// This file is how the engine says what it does: a stage's start, a node's phase and a
// stage-wide step go to Progress and, as plain lines, to Out; a failure becomes the
// *PauseError the runner records.

// stage reports the start of a stage.
func (e *Engine) stage(index, total int, name string) {
	e.line("Stage %d/%d %s", index, total, name)

	if e.Progress != nil {
		e.Progress.Stage(index, total, name)
	}
}

// node reports a node's phase.
func (e *Engine) node(stage, node string, phase NodePhase, format string, args ...any) {
	msg := text.OneLine(fmt.Sprintf(format, args...))
	e.line("  %s %s: %s", node, phase, msg)

	if e.Progress != nil {
		e.Progress.Node(stage, node, phase, msg)
	}
}

// step reports a stage-wide step.
func (e *Engine) step(stage, step, format string, args ...any) {
	msg := text.OneLine(fmt.Sprintf(format, args...))
	e.line("  [%s] %s", step, msg)

	if sp, ok := e.Progress.(StepProgress); ok {
		sp.Step(stage, step, msg)
	}
}

// stepTime reports how far a stage-wide step has come.
func (e *Engine) stepTime(stage, step string, t StepTiming) {
	if st, ok := e.Progress.(StepTimer); ok {
		st.StepTime(stage, step, t)
	}
}

func (e *Engine) line(format string, args ...any) {
	if e.Out == nil {
		return
	}

	e.outMu.Lock()
	defer e.outMu.Unlock()

	_, _ = fmt.Fprintf(e.Out, format+"\n", args...)
}

// pause reports a failed node (when node is set) and returns the
// *PauseError; when ctx ended, it returns ctx's error instead, wrapped, for
// the runner to tell a stop from a failure.
func (e *Engine) pause(ctx context.Context, stage, node, reason, action string, err error) error {
	if ctx.Err() != nil {
		if node != "" {
			return fmt.Errorf("stage %s: node %q: %w", stage, node, ctx.Err())
		}

		return fmt.Errorf("stage %s: %w", stage, ctx.Err())
	}

	reason = text.OneLine(reason)

	if node != "" {
		e.node(stage, node, PhaseFailed, "%s", reason)
	} else if stage != "" {
		e.step(stage, "failed", "%s", reason)
	}

	return &PauseError{Stage: stage, Node: node, Reason: reason, Action: action, Err: err}
}

// Actions the pauses suggest, in both upgrades.
const (
	actionResume      = "fix the cause, then resume (kubectl ichor resume)"
	actionTalosAccess = "check the node's Talos API is reachable with the credentials (talosctl -n <node> version), then resume"
)

// verifyAction is what to do about a node that did not verify in time.
func verifyAction(node string) string {
	return fmt.Sprintf("see what is not Ready (kubectl describe node %s; kubectl -n %s get pods -o wide --field-selector spec.nodeName=%s), fix it, then resume",
		node, discovery.StaticPodNamespace, node)
}
