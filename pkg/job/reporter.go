package job

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	api "github.com/ichor-dev/kubectl-ichor/pkg/api/v1alpha1"
	"github.com/ichor-dev/kubectl-ichor/pkg/engine"
)

// reporter is the engine's Progress and Memo, backed by the state ConfigMap. It keeps
// the runner's view of the operation's status and writes it whenever it changes: Progress
// calls return at once (one writer goroutine catches up, so a slow API does not hold the
// engine), Memo.Set returns once the value is written. A write that finds the operation
// aborted or replaced stops the engine.
type reporter struct {
	store   *Store
	events  *eventRecorder
	now     func() time.Time
	logf    func(format string, args ...any)
	aborted func()

	// identity is the runner's name as the state's Runner holds it while this runner
	// leads; a write that finds another name there is refused (errLostLock).
	identity string
	// fence, when set, is asked before every write whether the runner still holds the
	// lock, from what its elector knows (no request): it returns the time until which
	// a write may land (the Lease's expiry as the runner last renewed it), or
	// errLostLock (nothing more is written, the engine stops).
	fence func(ctx context.Context) (time.Time, error)
	// lost stops the engine once the lock is lost.
	lost func()
	// setTimeout bounds a Memo.Set (stateWriteTimeout when zero).
	setTimeout time.Duration

	writeMu sync.Mutex // one write at a time

	mu      sync.Mutex
	op      api.Operation
	version uint64 // bumped on every change
	written uint64 // the last version written
	failed  error  // the operation was aborted or replaced, or the lock lost: nothing more is written
	lastErr error  // the last write's error, nil once one succeeds
	notify  chan struct{}
	kick    chan struct{}
	// urgent wakes the writer from its gap between two writes: a change is waited for
	// (Memo.Set, record).
	urgent chan struct{}
}

// progressWriteGap is the least time between two writes of the state that nobody waits
// for: progress of that time (a batch of nodes entering a phase) is one write, not one
// per node. A write that is waited for goes at once.
const progressWriteGap = 500 * time.Millisecond

var (
	_ engine.Progress     = (*reporter)(nil)
	_ engine.Memo         = (*reporter)(nil)
	_ engine.StepProgress = (*reporter)(nil)
	_ engine.StepTimer    = (*reporter)(nil)
)

func newReporter(store *Store, op *api.Operation, events *eventRecorder, now func() time.Time, logf func(string, ...any), aborted func()) *reporter {
	return &reporter{
		store: store, events: events, now: now, logf: logf, aborted: aborted,
		op:     *op,
		notify: make(chan struct{}),
		kick:   make(chan struct{}, 1),
		urgent: make(chan struct{}, 1),
	}
}

// Stage implements engine.Progress.
func (r *reporter) Stage(index, total int, name string) {
	r.change(func(s *api.OperationStatus) {
		s.Stage, s.StageIndex, s.StageCount, s.Step = name, index, total, ""
	})
	r.events.operation(context.Background(), "Stage", fmt.Sprintf("stage %d/%d %s started", index, total, name), false)
}

// nodeEventPhases are the node phases said as Kubernetes events (reporter.Node).
var nodeEventPhases = []engine.NodePhase{
	engine.PhaseCordoned, engine.PhaseApplying, engine.PhaseUpgrading, engine.PhaseDone, engine.PhaseFailed, engine.PhaseHeld,
}

// Node implements engine.Progress. A node entering a phase an operator looks for in
// `kubectl get events` (nodeEventPhases: cordoned, its change begun, done, failed, held)
// is also a Kubernetes event about the Node; the other phases (pending, draining,
// verifying) and the messages within a phase (a pod evicted, what verification still
// waits for) are only in the state and the log.
func (r *reporter) Node(stage, node string, phase engine.NodePhase, message string) {
	now := r.now()

	var step bool

	r.change(func(s *api.OperationStatus) {
		prev := s.Node(node)
		step = prev == nil || prev.Stage != stage || prev.Phase != string(phase)
		SetNode(s, stage, node, phase, message, now)
	})

	if step && slices.Contains(nodeEventPhases, phase) {
		r.events.node(context.Background(), node, string(phase), fmt.Sprintf("%s: %s", stage, message), phase == engine.PhaseFailed)
	}
}

// Step implements engine.StepProgress.
func (r *reporter) Step(stage, step, message string) {
	r.change(func(s *api.OperationStatus) {
		s.Step = step + ": " + message
		if step == engine.StepManifests {
			s.Manifests = message
		}
	})
	r.events.operation(context.Background(), "Step", fmt.Sprintf("%s %s: %s", stage, step, message), false)
}

// StepTime implements engine.StepTimer. It asks for no write of its own:
// the engine reports the step's message right after (Step), and that write
// carries both.
func (r *reporter) StepTime(stage, step string, t engine.StepTiming) {
	now := r.now()

	r.mu.Lock()
	defer r.mu.Unlock()

	SetStep(&r.op.Status, stage, step, t, now)
	r.version++
}

// SetNode records a node's step (a change of phase or message) in s, and in the
// node's timeline when the step begins its apply (a Talos upgrade's: its
// Upgrade call) or ends it.
func SetNode(s *api.OperationStatus, stage, name string, phase engine.NodePhase, message string, now time.Time) {
	n := s.Node(name)
	if n == nil {
		s.Nodes = append(s.Nodes, api.NodeStatus{Name: name})
		n = &s.Nodes[len(s.Nodes)-1]
	}

	if n.Stage != stage || n.Phase != string(phase) || n.Since.IsZero() {
		n.Since = metav1.NewTime(now.UTC().Truncate(time.Second))
	}

	n.Stage, n.Phase, n.Message = stage, string(phase), message

	applying := phase == engine.PhaseApplying || phase == engine.PhaseUpgrading
	if !applying && phase != engine.PhaseDone {
		return
	}

	i := slices.IndexFunc(n.Timeline, func(t api.NodeStageTimes) bool { return t.Stage == stage })
	if i < 0 {
		n.Timeline = append(n.Timeline, api.NodeStageTimes{Stage: stage})
		i = len(n.Timeline) - 1
	}

	at := metav1.NewMicroTime(now.UTC())

	switch t := &n.Timeline[i]; {
	case applying && t.ApplyStarted == nil:
		t.ApplyStarted = &at
	case phase == engine.PhaseDone && t.Done == nil:
		t.Done = &at
	}
}

// SetStep records in s how far a stage's step has come.
func SetStep(s *api.OperationStatus, stage, step string, t engine.StepTiming, now time.Time) {
	at := metav1.NewMicroTime(now.UTC())

	r := s.StepOf(stage, step)
	if r == nil {
		s.Steps = append(s.Steps, api.StepRecord{Stage: stage, Step: step, Started: at})
		r = &s.Steps[len(s.Steps)-1]
	}

	if t.Pods > 0 {
		r.Pods, r.Updated, r.MaxUnavailable, r.Observed = t.Pods, t.Updated, t.MaxUnavailable, &at
	}

	if t.Done {
		r.Done = &at
	}
}

// Get implements engine.Memo.
func (r *reporter) Get(key string) (string, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()

	v, found := r.op.Status.Memo[key]

	return v, found
}

// stateWriteTimeout bounds a Memo.Set: the engine is told the state could not be written
// (and pauses with why) rather than wait for ever.
const stateWriteTimeout = 30 * time.Second

// Set implements engine.Memo: it returns once the value is in the state ConfigMap, or
// with why it is not after a deadline (a write refused by an admission webhook or
// policy, the ConfigMap deleted, its size limit, the lock lost).
func (r *reporter) Set(ctx context.Context, key, value string) error {
	return r.record(ctx, func(s *api.OperationStatus) {
		if s.Memo == nil {
			s.Memo = map[string]string{}
		}

		s.Memo[key] = value
	})
}

// record applies mutate to the status and returns once it is in the state ConfigMap, or
// with why it is not after a deadline (as Set).
func (r *reporter) record(ctx context.Context, mutate func(s *api.OperationStatus)) error {
	v := r.change(mutate)

	timeout := r.setTimeout
	if timeout <= 0 {
		timeout = stateWriteTimeout
	}

	wctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()

	err := r.wait(wctx, v)
	if err != nil && ctx.Err() == nil && wctx.Err() != nil {
		r.mu.Lock()
		last := r.lastErr
		r.mu.Unlock()

		if last == nil {
			last = errors.New("no answer")
		}

		return fmt.Errorf("the state ConfigMap was not written within %s: %w", timeout, last)
	}

	return err
}

// change applies mutate to the status and asks the writer to write it.
func (r *reporter) change(mutate func(s *api.OperationStatus)) uint64 {
	r.mu.Lock()
	mutate(&r.op.Status)
	r.version++
	v := r.version
	r.mu.Unlock()

	select {
	case r.kick <- struct{}{}:
	default:
	}

	return v
}

// wait returns once version v is written, or the writes failed for good, or ctx ended.
func (r *reporter) wait(ctx context.Context, v uint64) error {
	select {
	case r.urgent <- struct{}{}:
	default:
	}

	for {
		r.mu.Lock()
		written, failed, notify := r.written, r.failed, r.notify
		r.mu.Unlock()

		switch {
		case failed != nil:
			return failed
		case written >= v:
			return nil
		}

		select {
		case <-ctx.Done():
			return fmt.Errorf("write the state: %w", context.Cause(ctx))
		case <-notify:
		}
	}
}

// loop writes every change until ctx ends.
func (r *reporter) loop(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-r.kick:
		}

		if err := r.write(ctx); err != nil && !errors.Is(err, errAborted) && !errors.Is(err, errLostLock) && ctx.Err() == nil {
			r.logf("write the state: %v (trying again)", err)

			select {
			case <-ctx.Done():
				return
			case <-time.After(time.Second):
			}

			select {
			case r.kick <- struct{}{}:
			default:
			}

			continue
		}

		// The changes until the gap ends, or until one is waited for, go in the next write.
		select {
		case <-ctx.Done():
			return
		case <-r.urgent:
		case <-time.After(progressWriteGap):
		}
	}
}

// write writes the current status, unless the operation was aborted or replaced (then
// it stops the engine).
func (r *reporter) write(ctx context.Context) error {
	r.writeMu.Lock()
	defer r.writeMu.Unlock()

	r.mu.Lock()
	if r.failed != nil {
		r.mu.Unlock()

		return r.failed
	}

	v := r.version
	if v == r.written {
		r.mu.Unlock()

		return nil
	}

	id := r.op.Spec.ID
	status := cloneStatus(r.op.Status)
	r.mu.Unlock()

	wctx := ctx

	if r.fence != nil {
		until, err := r.fence(ctx)
		if err != nil {
			r.mu.Lock()
			r.failed = err
			close(r.notify)
			r.notify = make(chan struct{})
			r.mu.Unlock()

			if r.lost != nil {
				r.lost()
			}

			return err
		}

		var cancel context.CancelFunc

		wctx, cancel = context.WithDeadline(ctx, until)
		defer cancel()
	}

	_, err := r.store.Update(wctx, func(o *api.Operation) error {
		if o.Spec.ID != id {
			return fmt.Errorf("%w: operation %s was replaced by %s", errAborted, id, o.Spec.ID)
		}

		if o.Status.Phase == api.PhaseAborted {
			return errAborted
		}

		// The fencing token: a runner that takes the lock writes its name into the
		// state before it acts (Runner.lead). Once another has, this runner's writes
		// are refused here: its update is conditional on the state it read, so the
		// successor's claim either came before that read (and is seen) or makes the
		// update conflict and read again.
		if r.identity != "" && o.Status.Runner != r.identity {
			return fmt.Errorf("%w: runner %s took operation %s over", errLostLock, o.Status.Runner, id)
		}

		o.Status = status

		return nil
	})

	r.mu.Lock()
	defer r.mu.Unlock()

	switch {
	case err == nil:
		r.written = max(r.written, v)
		r.lastErr = nil
	case errors.Is(err, errAborted), errors.Is(err, errLostLock):
		r.failed = err
	default:
		r.lastErr = err

		return err
	}

	close(r.notify)
	r.notify = make(chan struct{})

	switch {
	case r.failed == nil:
		return nil
	case errors.Is(r.failed, errLostLock):
		if r.lost != nil {
			r.lost()
		}
	default:
		r.aborted()
	}

	return r.failed
}

// flush writes what is not written yet, trying again until ctx ends.
func (r *reporter) flush(ctx context.Context) error {
	for {
		err := r.write(ctx)
		if err == nil || errors.Is(err, errAborted) || errors.Is(err, errLostLock) {
			return err
		}

		select {
		case <-ctx.Done():
			return fmt.Errorf("write the state: %w (last: %v)", ctx.Err(), err)
		case <-time.After(500 * time.Millisecond):
		}
	}
}

// finish applies the runner's last change and writes it.
func (r *reporter) finish(ctx context.Context, mutate func(s *api.OperationStatus)) error {
	r.change(mutate)

	if err := r.flush(ctx); err != nil {
		if errors.Is(err, errAborted) {
			return &ExitError{Code: ExitFinal, Err: err}
		}

		return err
	}

	return nil
}

// cloneStatus is a deep copy of the status.
func cloneStatus(s api.OperationStatus) api.OperationStatus {
	s.Nodes = slices.Clone(s.Nodes)
	for i := range s.Nodes {
		s.Nodes[i].Timeline = slices.Clone(s.Nodes[i].Timeline)
	}

	s.Memo = maps.Clone(s.Memo)
	s.Steps = slices.Clone(s.Steps)
	s.Runners = slices.Clone(s.Runners)
	s.Hops = slices.Clone(s.Hops)
	s.Pauses = slices.Clone(s.Pauses)

	return s
}
