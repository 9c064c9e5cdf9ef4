package job

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"sync/atomic"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/client-go/tools/leaderelection/resourcelock"

	api "github.com/ichor-dev/kubectl-ichor/pkg/api/v1alpha1"
	"github.com/ichor-dev/kubectl-ichor/pkg/engine"
	"github.com/ichor-dev/kubectl-ichor/pkg/kube"
	"github.com/ichor-dev/kubectl-ichor/pkg/stages"
	"github.com/ichor-dev/kubectl-ichor/pkg/talos"
)

// Engine runs one upgrade to its end, or stops with a *engine.PauseError, or with its
// context's error; *engine.Engine satisfies it.
type Engine interface {
	Run(ctx context.Context) error
}

// EngineConfig is what the runner gives the engine it builds.
type EngineConfig struct {
	// Kube and Dynamic reach the cluster with the runner's ServiceAccount.
	Kube    kubernetes.Interface
	Dynamic dynamic.Interface
	// Options come from the operation's spec; Self is the runner's node.
	Options engine.Options
	// Progress and Memo are backed by the state ConfigMap.
	Progress engine.Progress
	Memo     engine.Memo
	// Out receives the engine's progress lines (the pod's log).
	Out io.Writer
	// Talos says how to reach the Talos API; the zero value finds the talosconfig
	// mounted in the Job's pod.
	Talos talos.Options
	// Nodes is the runner's watch of the Nodes, started once and shared by every
	// engine it builds.
	Nodes *kube.Nodes
}

// EngineFactory builds the engine of one run, opening what else it needs (the Talos
// API); release releases that, and may be nil.
type EngineFactory func(ctx context.Context, cfg EngineConfig) (eng Engine, release func(), err error)

// ExitError is how the runner ends other than by succeeding: Code is the process's exit
// code, which the Job's podFailurePolicy reads (ExitPaused, ExitFinal; any other code is
// retried by the Job).
type ExitError struct {
	Code int
	Err  error
}

// Error implements error.
func (e *ExitError) Error() string { return e.Err.Error() }

// Unwrap returns the cause.
func (e *ExitError) Unwrap() error { return e.Err }

// ExitStopped is the exit code of a runner stopped by a signal (its pod was deleted or
// evicted): the state stays Running and the next pod continues.
const ExitStopped = 143

// Runner is the body of `kubectl-ichor run` in the Job's pod: it takes the lock, drives
// the engine, and keeps the state ConfigMap and the events up to date.
type Runner struct {
	// Kube and Dynamic reach the cluster (in-cluster config: the runner's ServiceAccount).
	Kube    kubernetes.Interface
	Dynamic dynamic.Interface
	// LockKube renews the lock and reads it before each state write; nil: Kube. Built
	// from LockClientConfig, it has connections of its own and bounded requests, so that
	// a renewal never waits on a connection to an apiserver that went away.
	LockKube kubernetes.Interface
	// Namespace is the product's namespace; Operation the ID of the operation to run.
	Namespace string
	Operation string
	// Identity is the runner's pod name: the lock's holder identity.
	Identity string
	// Node is the node the runner runs on (the engine moves it last).
	Node string
	// StayOnNode says the runner's pod tolerates the cordon because no other
	// node can host it: the drain of its node keeps it (JobParams.StayOnNode).
	StayOnNode bool
	// NoCredentials says the pod started without its Talos credentials: their
	// Secret is an optional volume, deleted when the operation ends (see Run).
	NoCredentials bool
	// NewEngine builds the engine.
	NewEngine EngineFactory
	// Talos is given to NewEngine (EngineConfig.Talos).
	Talos talos.Options
	// Out receives the runner's log lines.
	Out io.Writer
	// Now is the clock; nil means time.Now.
	Now func() time.Time

	// LeaseDuration, RenewDeadline and RetryPeriod override the lock's timings (tests).
	LeaseDuration, RenewDeadline, RetryPeriod time.Duration
	// StateWriteTimeout overrides how long a Memo.Set may take (tests).
	StateWriteTimeout time.Duration

	// nodes is the watch of the Nodes while the runner leads: every engine it
	// builds reads the Nodes from it, and its events the Nodes' UIDs.
	nodes *kube.Nodes
	// handOver is the hand-over of the run that leads; nil for a runner that stays on
	// its node.
	handOver *handOver
}

var (
	errLostLock = errors.New("lost the lock")
	errAborted  = errors.New("the operation was aborted")
)

func (r *Runner) now() time.Time {
	if r.Now != nil {
		return r.Now()
	}

	return time.Now()
}

func (r *Runner) logf(format string, args ...any) {
	if r.Out != nil {
		_, _ = fmt.Fprintf(r.Out, format+"\n", args...)
	}
}

func (r *Runner) store() *Store {
	return &Store{Client: r.Kube.CoreV1(), Namespace: r.Namespace, Now: r.Now}
}

func (r *Runner) timings() (lease, renew, retry time.Duration) {
	lease, renew, retry = LeaseDuration, RenewDeadline, RetryPeriod
	if r.LeaseDuration > 0 {
		lease = r.LeaseDuration
	}

	if r.RenewDeadline > 0 {
		renew = r.RenewDeadline
	}

	if r.RetryPeriod > 0 {
		retry = r.RetryPeriod
	}

	return lease, renew, retry
}

// Run runs the operation: it checks that the state still wants it run, waits for the
// lock, and once it holds it drives the engine until the operation succeeds (nil) or
// pauses (*ExitError with ExitPaused). It stops changing anything the moment it loses the
// lock, and when ctx ends (its pod is stopped) it stops the engine, writes its last
// progress and releases the lock before it returns.
func (r *Runner) Run(ctx context.Context) error {
	op, _, err := r.store().Get(ctx)
	if err != nil {
		var corrupt *CorruptStateError
		if errors.As(err, &corrupt) || errors.Is(err, ErrNoOperation) {
			return &ExitError{Code: ExitFinal, Err: err}
		}

		if r.NoCredentials && (apierrors.IsForbidden(err) || apierrors.IsUnauthorized(err)) {
			return endedErr(r.Operation)
		}

		return err
	}

	if err := r.wanted(op); err != nil {
		return err
	}

	if r.NoCredentials {
		return &ExitError{Code: ExitFinal, Err: fmt.Errorf("operation %s is %s but the runner's Talos credentials (%s) are gone: "+
			"kubectl ichor resume%s writes them again", op.Spec.ID, op.Status.Phase, describe("secret", r.Namespace, credentialsSecret(op.Spec.Credentials)), nsFlag(r.Namespace))}
	}

	r.logf("operation %s: %s upgrade to %s; runner %s on node %s waiting for the lock %s",
		op.Spec.ID, op.Spec.Upgrade, op.Spec.Target, r.Identity, r.Node, describe("lease", LockNamespace, LockName))

	held, err := r.takeOverFromGone(ctx)
	if err != nil {
		r.logf("could not check the lock's holder: %v", err)
	}

	lease, renew, retry := r.timings()

	// The elector's context outlives ctx: when ctx ends, the engine is stopped first and
	// the lock released only after that (ReleaseOnCancel), never while it still acts.
	leCtx, leCancel := context.WithCancel(context.WithoutCancel(ctx))
	defer leCancel()

	var (
		leading  atomic.Bool
		result   error
		done     = make(chan struct{})
		waitErr  error
		waitOnce sync.Once
	)

	var elector *leaderelection.LeaderElector

	lock := &renewingLock{Interface: &resourcelock.LeaseLock{
		LeaseMeta:  metav1.ObjectMeta{Name: LockName, Namespace: LockNamespace},
		Client:     r.lockKube().CoordinationV1(),
		LockConfig: resourcelock.ResourceLockConfig{Identity: HolderIdentity(r.Namespace, r.Identity)},
		Labels:     commonLabels(nil),
	}}

	elector, err = leaderelection.NewLeaderElector(leaderelection.LeaderElectionConfig{
		Lock:          lock,
		LeaseDuration: lease,
		RenewDeadline: renew,
		RetryPeriod:   retry,
		// Released by releaseOwnLock, on the condition that the Lease still names this
		// runner: client-go's release writes over a holder it has not noticed yet.
		ReleaseOnCancel: false,
		Name:            LockName,
		Callbacks: leaderelection.LeaderCallbacks{
			OnStartedLeading: func(lctx context.Context) {
				defer close(done)
				defer leCancel()

				leading.Store(true)
				result = r.lead(ctx, lctx, op.Spec.ID, fence(lctx, elector, lock, lease))
			},
			OnStoppedLeading: func() {},
		},
	})
	if err != nil {
		return fmt.Errorf("lock %s: %w", describe("lease", LockNamespace, LockName), err)
	}

	// While it waits for the lock, the runner gives up when ctx ends or when the
	// operation no longer wants a runner (aborted, replaced, paused by another).
	go func() {
		t := time.NewTicker(2 * retry)
		defer t.Stop()

		for !leading.Load() {
			select {
			case <-leCtx.Done():
				return
			case <-ctx.Done():
				if !leading.Load() {
					waitOnce.Do(func() { waitErr = &ExitError{Code: ExitStopped, Err: errors.New("stopped while waiting for the lock")} })
					leCancel()
				}

				return
			case <-t.C:
				op, _, err := r.store().Get(ctx)
				if err == nil {
					err = r.wanted(op)
				}

				var exit *ExitError
				if errors.As(err, &exit) && !leading.Load() {
					waitOnce.Do(func() { waitErr = err })
					leCancel()

					return
				}
			}
		}
	}()

	if held != nil {
		// The holder runs: the elector's first try comes the moment it lets go.
		awaitRelease(leCtx, r.Kube, held, lease)
	}

	elector.Run(leCtx)

	if !leading.Load() {
		waitOnce.Do(func() { waitErr = &ExitError{Code: ExitStopped, Err: errors.New("stopped while waiting for the lock")} })

		return waitErr
	}

	<-done

	r.releaseOwnLock(ctx)

	var exit *ExitError
	if errors.As(result, &exit) && exit.Code == ExitHandedOver {
		r.awaitSuccessor(ctx)
	}

	if result == nil {
		// The lock is released: the runner's credentials go, the state stays.
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), RenewDeadline)
		defer cancel()

		r.removeOwnCredentials(cctx)
	}

	return result
}

// lockKube is the client of the lock.
func (r *Runner) lockKube() kubernetes.Interface {
	if r.LockKube != nil {
		return r.LockKube
	}

	return r.Kube
}

// releaseOwnLock clears the lock once the engine stopped, when the Lease still names
// this runner (and did not change meanwhile), so that the next runner takes it at once.
// A runner that lost the Lease leaves it alone.
func (r *Runner) releaseOwnLock(ctx context.Context) {
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), RenewDeadline)
	defer cancel()

	lock, err := ReadLock(rctx, r.Kube)
	if err != nil || lock == nil || lock.Holder != HolderIdentity(r.Namespace, r.Identity) {
		return
	}

	if err := releaseLock(rctx, r.Kube, lock); err != nil {
		r.logf("could not release the lock: %v (it expires by itself)", err)
	}
}

// endedErr is how a runner ends that started after its operation ended. The
// runner's own end removes its credentials once it wrote Succeeded: its Talos
// credentials' Secret, then its RBAC. A container started after that (its node's
// new kubelet restarted it, a moment after the runner saw that node Ready)
// finds no credentials mounted and cannot read the state; its ServiceAccount,
// bound to nothing, is kept so that it can start at all. It has nothing to do:
// it exits 0, which ends the Job. (abort removes the same credentials, and
// deletes the Jobs of the operation it stops.)
func endedErr(operation string) error {
	return &ExitError{Code: 0, Err: fmt.Errorf("operation %s ended: its runner's credentials were removed; nothing to do "+
		"(kubectl ichor status says how it ended)", operation)}
}

// wanted returns nil when op is the runner's operation and wants a runner, else the
// *ExitError to end with.
func (r *Runner) wanted(op *api.Operation) error {
	switch {
	case op.Spec.ID != r.Operation:
		return &ExitError{Code: ExitFinal, Err: fmt.Errorf("operation %s was replaced by %s: this runner stops", r.Operation, op.Spec.ID)}
	case op.Status.Phase == api.PhaseSucceeded:
		return &ExitError{Code: 0, Err: fmt.Errorf("operation %s already succeeded", op.Spec.ID)}
	case op.Status.Phase == api.PhaseAborted:
		return &ExitError{Code: ExitFinal, Err: fmt.Errorf("operation %s was aborted: this runner stops", op.Spec.ID)}
	case op.Status.Phase == api.PhasePaused:
		return &ExitError{Code: ExitPaused, Err: fmt.Errorf("operation %s is paused (%s): continue it with kubectl ichor resume", op.Spec.ID, op.Status.Reason)}
	}

	return nil
}

// takeOverFromGone clears the lock when its holder is a pod that is gone or ended, so
// that this runner need not wait for the lease to expire. A holder that still runs, or
// whose fate is unknown, keeps it until it expires or lets it go: that lock is returned
// (nil when nobody else holds it).
func (r *Runner) takeOverFromGone(ctx context.Context) (*Lock, error) {
	lock, err := ReadLock(ctx, r.Kube)
	if err != nil || lock == nil || lock.Holder == "" || lock.Holder == HolderIdentity(r.Namespace, r.Identity) {
		return nil, err
	}

	gone, err := holderGone(ctx, r.Kube, lock.Holder)
	if err != nil || !gone {
		if err == nil {
			r.logf("the lock is held by %s: waiting for it (one operation per cluster)", lock.Holder)

			return lock, nil
		}

		return nil, err
	}

	if err := releaseLock(ctx, r.Kube, lock); err != nil {
		return nil, err
	}

	r.logf("the lock's holder %s is gone: lock released", lock.Holder)

	return nil, nil
}

// lead runs while the runner holds the lock; lctx ends when it loses it.
func (r *Runner) lead(ctx, lctx context.Context, id string, fence func(context.Context) (time.Time, error)) error {
	if lctx.Err() != nil {
		return &ExitError{Code: 1, Err: errLostLock}
	}

	engCtx, stop := context.WithCancelCause(ctx)
	defer stop(nil)

	go func() {
		select {
		case <-lctx.Done():
			stop(errLostLock)
		case <-engCtx.Done():
		}
	}()

	now := r.now()

	op, err := r.store().Update(engCtx, func(o *api.Operation) error {
		if err := r.wanted(o); err != nil {
			return err
		}

		// A Pending operation that had runners was paused, then resumed.
		o.Status.StartRunner(r.Identity, r.Node, o.Status.Phase == api.PhasePending && o.Status.Runs > 0, o.Spec.CreatedAt.Time, now)
		o.Status.Runners[len(o.Status.Runners)-1].StaysOnNode = r.StayOnNode
		o.Status.Phase = api.PhaseRunning
		o.Status.Runner = r.Identity
		o.Status.Runs++
		o.Status.Reason, o.Status.Action, o.Status.PausedNode = "", "", ""

		if o.Status.StartedAt == nil {
			o.Status.StartedAt = ptrTime(now)
		}

		return nil
	})
	if err != nil {
		var exit *ExitError
		if errors.As(err, &exit) {
			return err
		}

		return fmt.Errorf("operation %s: take it over: %w", id, err)
	}

	r.logf("took the lock: operation %s is Running (run %d of job %s)", id, op.Status.Runs, op.Status.Job)

	// One watch of the Nodes for the whole run, whatever the hops: a Node read
	// from it costs no request.
	nodes, nodesErr := kube.StartNodes(engCtx, r.Kube)
	if nodesErr == nil {
		defer nodes.Stop()

		r.nodes = nodes
		defer func() { r.nodes = nil }()
	}

	events := newEventRecorder(r.Kube, r.nodes, r.Namespace, r.Identity, r.Node, r.logf)
	defer events.close()

	events.operation(ctx, "Running", fmt.Sprintf("runner %s took the lock (run %d)", r.Identity, op.Status.Runs), false)

	if !r.StayOnNode {
		h := &handOver{r: r, stop: stop}
		r.handOver = h
		defer func() { r.handOver = nil }()

		go r.settleParallelism(engCtx, h)
	}

	rep := newReporter(r.store(), op, events, r.now, r.logf, func() { stop(errAborted) })
	rep.identity, rep.fence, rep.lost, rep.setTimeout = r.Identity, fence, func() { stop(errLostLock) }, r.StateWriteTimeout
	go rep.loop(engCtx)

	switch {
	case nodesErr != nil && engCtx.Err() != nil:
		err = nodesErr
	case nodesErr != nil:
		err = &engine.PauseError{Reason: nodesErr.Error(), Action: "fix the cause, then kubectl ichor resume" + nsFlag(r.Namespace), Err: nodesErr}
	default:
		err = r.runHops(engCtx, op, rep, events)
	}

	return r.finish(ctx, engCtx, rep, events, err)
}

// runHops runs the operation's upgrades in order from the one its state is at: the one
// upgrade of a plain operation, or a path's hops. A path records each hop's start and
// end in the state before it goes on, so that a replaced runner continues at the hop it
// was in, and pauses after each hop but the last when asked to.
func (r *Runner) runHops(ctx context.Context, op *api.Operation, rep *reporter, events *eventRecorder) error {
	runs := op.Spec.Runs()
	path := op.Spec.Upgrade == api.UpgradeCluster
	ns := nsFlag(r.Namespace)

	if path && len(op.Status.Hops) == 0 {
		if err := r.prePullPath(ctx, op, rep, events); err != nil {
			return err
		}
	}

	for n := op.Status.NextHop(); n <= len(runs); n++ {
		hop := runs[n-1]

		if path {
			if err := rep.record(ctx, func(s *api.OperationStatus) { s.StartHop(op.Spec, n, r.now()) }); err != nil {
				return fmt.Errorf("hop %d/%d (%s): record its start: %w", n, len(runs), hop.Label(), err)
			}

			r.logf("hop %d/%d: %s upgrade to %s", n, len(runs), hop.Upgrade, hop.To)
			events.operation(ctx, "Hop", fmt.Sprintf("hop %d/%d started: %s", n, len(runs), hop.Label()), false)
		}

		opts := engineOptions(op.Spec, hop, r.Node)
		opts.SelfPod = r.Namespace + "/" + r.Identity
		opts.StayOnNode = r.StayOnNode

		if r.handOver != nil {
			opts.HandOver = r.handOver
		}

		if err := r.runEngine(ctx, opts, rep, rep); err != nil || !path {
			return err
		}

		if err := rep.record(ctx, func(s *api.OperationStatus) { s.EndHop(n, r.now()) }); err != nil {
			return fmt.Errorf("hop %d/%d (%s) is done, but the state could not say so: %w", n, len(runs), hop.Label(), err)
		}

		r.logf("hop %d/%d done: every node at %s %s", n, len(runs), hop.Upgrade, hop.To)
		events.operation(ctx, "Hop", fmt.Sprintf("hop %d/%d done: %s", n, len(runs), hop.Label()), false)

		if op.Spec.PauseBetweenHops && n < len(runs) {
			return &engine.PauseError{
				Reason: fmt.Sprintf("hop %d/%d (%s) is done; the path pauses between hops (--pause-between-hops), hop %d/%d (%s) is next",
					n, len(runs), hop.Label(), n+1, len(runs), runs[n].Label()),
				Action: "check the cluster and its workloads, then kubectl ichor resume" + ns,
			}
		}
	}

	return nil
}

// runEngine builds the engine of one upgrade and runs it.
func (r *Runner) runEngine(ctx context.Context, opts engine.Options, progress engine.Progress, rep *reporter) error {
	eng, closeEngine, err := r.NewEngine(ctx, EngineConfig{
		Kube: r.Kube, Dynamic: r.Dynamic, Options: opts, Progress: progress, Memo: rep, Out: r.Out,
		Talos: r.Talos, Nodes: r.nodes,
	})
	if err != nil {
		return &engine.PauseError{Reason: "the engine could not start: " + err.Error(), Action: "fix the cause, then kubectl ichor resume" + nsFlag(r.Namespace), Err: err}
	}

	defer func() {
		if closeEngine != nil {
			closeEngine()
		}
	}()

	return eng.Run(ctx)
}

// prePullPath pulls, before a path's first change, what every hop will need on the
// nodes that will run it (each hop's engine with PullOnly: its stages' images, its
// installers): an image missing anywhere stops the path with nothing changed. Its
// progress is the state's step, not the hops' stages.
func (r *Runner) prePullPath(ctx context.Context, op *api.Operation, rep *reporter, events *eventRecorder) error {
	runs := op.Spec.Runs()

	for n, hop := range runs {
		what := fmt.Sprintf("pre-pull of the path's images: hop %d/%d (%s)", n+1, len(runs), hop.Label())
		rep.change(func(s *api.OperationStatus) { s.Step = what })
		r.logf("%s", what)

		opts := engineOptions(op.Spec, hop, r.Node)
		opts.PullOnly = true

		err := r.runEngine(ctx, opts, nil, rep)
		if err == nil {
			continue
		}

		var pause *engine.PauseError
		if errors.As(err, &pause) {
			p := *pause
			p.Reason = fmt.Sprintf("before the path's first change, hop %d/%d (%s): %s; nothing was changed", n+1, len(runs), hop.Label(), pause.Reason)
			p.Stage = ""

			return &p
		}

		return err
	}

	events.operation(ctx, "PrePulled", fmt.Sprintf("every image of the path's %d hops pulled on the nodes that run them", len(runs)), false)
	rep.change(func(s *api.OperationStatus) { s.Step = "" })

	return nil
}

// fence is the reporter's check before each write to the state, from what the elector
// knows, without a request: the runner still leads (lctx, which ends when a renewal
// fails for RenewDeadline, has not ended, and the elector has not seen another holder)
// and its last renewal has not expired. It returns that expiry: the write is given it as
// its deadline, so that it cannot land after another runner could have taken the Lease
// (one takes an expired Lease only, LeaseDuration after the last renewal it saw, and it
// sees a renewal only after it was sent). A successor that took the Lease early (its
// holder's pod gone) is fenced by the state itself: it names itself the state's Runner
// before it acts, and the reporter writes only while the state names this runner.
func fence(lctx context.Context, elector *leaderelection.LeaderElector, lock *renewingLock, lease time.Duration) func(context.Context) (time.Time, error) {
	return func(context.Context) (time.Time, error) {
		if lctx.Err() != nil || (elector != nil && !elector.IsLeader()) {
			return time.Time{}, errLostLock
		}

		renewed, ok := lock.renewed()
		until := renewed.Add(lease)

		if !ok || !time.Now().Before(until) {
			return time.Time{}, fmt.Errorf("%w: the last renewal of %s expired", errLostLock, describe("lease", LockNamespace, LockName))
		}

		return until, nil
	}
}

// finish records how the engine ended and returns the runner's exit.
func (r *Runner) finish(ctx, engCtx context.Context, rep *reporter, events *eventRecorder, err error) error {
	cause := context.Cause(engCtx)

	// The last writes may take a moment even when ctx ended (the pod's grace period).
	wctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), RenewDeadline)
	defer cancel()

	switch {
	case errors.Is(cause, errLostLock):
		r.logf("lost the lock: stopped without writing; the holder carries on")

		return &ExitError{Code: 1, Err: errLostLock}
	case errors.Is(cause, errHandedOver):
		to, waited := r.handOver.handedTo()

		rep.change(func(s *api.OperationStatus) { s.EndRunner(r.now()) })

		if ferr := rep.flush(wctx); ferr != nil {
			r.logf("last progress not written: %v", ferr)
		}

		events.operation(wctx, "HandedOver", fmt.Sprintf("runner %s on node %s handed over to %s on node %s before its node's reboot (the successor ran %s after the ask)",
			r.Identity, r.Node, to.Name, to.Spec.NodeName, waited.Round(time.Millisecond)), false)
		r.logf("handed over to %s: the operation stays Running; the successor continues from here", to.Name)

		return &ExitError{Code: ExitHandedOver, Err: fmt.Errorf("handed over to %s", HolderIdentity(r.Namespace, to.Name))}
	case errors.Is(cause, errAborted):
		r.logf("the operation was aborted: stopped")

		return &ExitError{Code: ExitFinal, Err: errAborted}
	case err == nil:
		ferr := rep.finish(wctx, func(s *api.OperationStatus) {
			s.Phase = api.PhaseSucceeded
			s.FinishedAt = ptrTime(r.now())
			s.EndRunner(r.now())
		})
		if ferr != nil {
			return ferr
		}

		events.operation(wctx, "Succeeded", "every stage is done", false)
		r.logf("operation %s Succeeded", r.Operation)

		return nil
	case ctx.Err() != nil:
		rep.change(func(s *api.OperationStatus) { s.EndRunner(r.now()) })

		if ferr := rep.flush(wctx); ferr != nil {
			r.logf("last progress not written: %v", ferr)
		}

		events.operation(wctx, "Stopped", "the runner was stopped; the next one continues", false)
		r.logf("stopped (%v): the operation stays Running; the next runner continues from here", context.Cause(ctx))

		return &ExitError{Code: ExitStopped, Err: fmt.Errorf("stopped: %w", context.Cause(ctx))}
	}

	var pause *engine.PauseError
	if !errors.As(err, &pause) {
		pause = &engine.PauseError{
			Reason: err.Error(),
			Action: "read the runner's log (kubectl ichor logs" + nsFlag(r.Namespace) + "), fix the cause, then kubectl ichor resume" + nsFlag(r.Namespace),
			Err:    err,
		}
	}

	ferr := rep.finish(wctx, func(s *api.OperationStatus) {
		s.Phase = api.PhasePaused
		s.Reason, s.Action, s.PausedNode = pause.Reason, pause.Action, pause.Node

		if pause.Stage != "" {
			s.Stage = pause.Stage
		}

		s.AddPause(s.Stage, pause.Node, pause.Reason, r.now())
		s.EndRunner(r.now())
	})
	if ferr != nil {
		if errors.Is(ferr, errLostLock) {
			r.logf("lost the lock: the pause (%s) is not written; the holder carries on", pause.Error())

			return &ExitError{Code: 1, Err: errLostLock}
		}

		// The state cannot be written (a webhook or policy refuses it, it was deleted):
		// the pause is said where it can be, an Event and the log; the Job's next pod
		// tries the state again.
		msg := fmt.Sprintf("%s; the state could not be written (%v): fix what refuses it", pause.Error(), ferr)
		events.operation(wctx, "PauseNotRecorded", msg, true)
		r.logf("operation %s: %s", r.Operation, msg)

		return ferr
	}

	events.operation(wctx, "Paused", pause.Error(), true)
	r.logf("operation %s Paused: %s", r.Operation, pause.Error())

	return &ExitError{Code: ExitPaused, Err: fmt.Errorf("paused: %w", pause)}
}

// engineOptions are the engine's options for one upgrade of an operation (the operation's
// own, or a hop of its path), run from node.
func engineOptions(spec api.OperationSpec, hop api.HopSpec, node string) engine.Options {
	return engine.Options{
		Kind:            engine.Kind(hop.Upgrade),
		Target:          hop.To,
		Installers:      stages.InstallerFlags(hop.Installers),
		MaxUnavailable:  spec.MaxUnavailable,
		ManifestsForce:  spec.ManifestsForce,
		Self:            node,
		AllowEtcdOutage: spec.AllowEtcdOutage,
		ApplyTimeout:    api.Timeout(spec.Timeouts.Apply),
		VerifyTimeout:   api.Timeout(spec.Timeouts.Verify),
		DrainTimeout:    api.Timeout(spec.Timeouts.Drain),
		UpgradeTimeout:  api.Timeout(spec.Timeouts.Upgrade),
		RebootTimeout:   api.Timeout(spec.Timeouts.Reboot),
		PullTimeout:     api.Timeout(spec.Timeouts.Pull),
		PullConcurrency: spec.PullConcurrency,
	}
}
