package engine

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/ichor-dev/kubectl-ichor/pkg/kube"
	"github.com/ichor-dev/kubectl-ichor/pkg/stages"
)

// This file is a node's cordon and drain, as both upgrades do them before a kubelet
// restart or a reboot: ichor's own cordon (its annotation says who cordoned), checked
// again after the drain so that a node uncordoned meanwhile is not restarted with pods.

// cordonAndDrain makes sure the node is cordoned (see ensureCordoned) and
// drains it; a node found schedulable again once drained (uncordoned during
// the drain) is cordoned and drained again, a bounded number of times. A
// failed drain uncordons it again. It returns how many pods it evicted
// (drainedSummary says it).
// kept, when set, says what stays on the node whatever happens (an install made
// before this drain): each pause's reason ends with it.
func (e *Engine) cordonAndDrain(ctx context.Context, opts Options, stage, name string, own ownPod, kept string) (int, error) {
	evicted := 0

	for round := 1; ; round++ {
		if err := e.ensureCordoned(ctx, stage, name, kept); err != nil {
			return 0, err
		}

		n, err := e.drain(ctx, opts, stage, name, own, kept)
		if err != nil {
			return 0, err
		}

		evicted += n

		if ours, err := e.stillCordoned(ctx, stage, name, kept); err != nil || ours {
			return evicted, err
		}

		if round == maxCordonRounds {
			err := fmt.Errorf("node %q was made schedulable again during each of %d drains", name, round)

			return 0, e.pause(ctx, stage, name, withKept(err.Error()+"; it is not rebooted while pods can land on it", kept),
				"find who uncordons it (kubectl get events --field-selector involvedObject.name="+name+"), stop them, then resume", err)
		}

		e.node(stage, name, PhaseCordoned, "made schedulable during its drain: cordoning and draining it again")
	}
}

// stillCordoned reads whether the drained node still carries ichor's cordon,
// from the API server, not the watch: whether the node may be restarted is
// decided on it, and an uncordon during the drain counts however recent. A
// read that fails pauses, its reason ending with kept.
func (e *Engine) stillCordoned(ctx context.Context, stage, name, kept string) (bool, error) {
	state, err := e.nodes.ReadCordon(ctx, name)
	if err != nil {
		return false, e.pause(ctx, stage, name, withKept(err.Error(), kept), actionResume, err)
	}

	return state == kube.CordonedByUs, nil
}

// withKept is a pause's reason with what stays on the node whatever the pause
// (kept, such as an install made before the drain; "" for nothing).
func withKept(reason, kept string) string {
	if kept == "" {
		return reason
	}

	return reason + "; " + kept
}

// drainedSummary is a node's drain in its Done line ("drained 3 pod(s)").
func drainedSummary(evicted int) string {
	return fmt.Sprintf("drained %d pod(s)", evicted)
}

// maxCordonRounds bounds cordonAndDrain's rounds.
const maxCordonRounds = 3

// ensureCordoned cordons the node unless it is cordoned and carries ichor's
// mark, never on an old read of it (kube.Nodes.EnsureCordoned): a node with
// the mark but schedulable (someone followed a pause message and ran kubectl
// uncordon) is cordoned again before any drain or reboot.
func (e *Engine) ensureCordoned(ctx context.Context, stage, name, kept string) error {
	state, err := e.nodes.EnsureCordoned(ctx, name, time.Now())
	if err != nil {
		return e.pause(ctx, stage, name, withKept(err.Error(), kept), actionResume, err)
	}

	switch state {
	case kube.CordonedByUs:
	case kube.MarkedButSchedulable:
		e.node(stage, name, PhaseCordoned, "cordoned again: it carried %s but was schedulable (uncordoned by hand)", kube.CordonedAnnotation)
	default:
		e.node(stage, name, PhaseCordoned, "cordoned (%s)", kube.CordonedAnnotation)
	}

	return nil
}

// ownPod is what a drain of Self does with the runner's own pod.
type ownPod int

const (
	// ownPodByStage: before a kubelet restart, or with StayOnNode, it stays; before a
	// reboot it leaves last, handed over to a successor or evicted.
	ownPodByStage ownPod = iota
	// ownPodUntilReboot: it stays through this drain, and a successor is asked for now,
	// to run by the time the runner leaves, right before the node's reboot (see
	// talosRun.drainLeft): the install between the two leaves the node's pods running.
	ownPodUntilReboot
)

// drain drains the cordoned node and returns how many pods it evicted. A
// failed drain uncordons it again.
func (e *Engine) drain(ctx context.Context, opts Options, stage, name string, own ownPod, kept string) (int, error) {
	evicted, err := e.drainer(ctx, opts, stage, name, own).Drain(ctx, name)
	if err != nil {
		return 0, e.drainFailed(ctx, stage, name, kept, err)
	}

	return evicted, nil
}

// drainer is the drain of the cordoned node name, its line said: what it does
// with the runner's own pod (see ownPod) and its bound.
func (e *Engine) drainer(ctx context.Context, opts Options, stage, name string, own ownPod) kube.Drainer {
	// The runner's own pod leaves its node last, and only before a reboot: a
	// kubelet restart leaves its container running, so through a Kubernetes
	// upgrade it stays, and no replacement waits out the Job's backoff. A runner
	// no other node can host stays through its node's reboot too (StayOnNode).
	last, keep := opts.SelfPod, ""
	if opts.StayOnNode || !stages.StageWork(stage).Reboots() {
		last, keep = "", opts.SelfPod
	}

	handsOverLater := own == ownPodUntilReboot && name == opts.Self && last != "" && opts.HandOver != nil
	if handsOverLater {
		last, keep = "", opts.SelfPod
	}

	// Before a reboot of its node, the runner hands its work to a successor
	// started elsewhere (the node is cordoned) rather than be evicted.
	var beforeLast func(context.Context) bool

	switch {
	case handsOverLater:
		e.node(stage, name, PhaseDraining, "draining (bound %s); the runner's own pod %s stays through the install and hands over to a successor pod, asked for now, before the reboot",
			opts.DrainTimeout, keep)
		opts.HandOver.Prepare(ctx)
	case keep != "" && name == opts.Self:
		e.node(stage, name, PhaseDraining, "draining (bound %s); the runner's own pod %s stays on it", opts.DrainTimeout, keep)
	case last != "" && name == opts.Self && opts.HandOver != nil:
		e.node(stage, name, PhaseDraining, "draining (bound %s); the runner hands over to a successor pod before its own pod's turn", opts.DrainTimeout)
		opts.HandOver.Prepare(ctx)
		beforeLast = opts.HandOver.Complete
	default:
		e.node(stage, name, PhaseDraining, "draining (bound %s)", opts.DrainTimeout)
	}

	return kube.Drainer{
		Client:          e.Kube,
		Timeout:         opts.DrainTimeout,
		EvictRetryDelay: e.evictRetryDelay,
		Last:            last,
		Keep:            keep,
		BeforeLast:      beforeLast,
		OnEvicted: func(pod string) {
			e.node(stage, name, PhaseDraining, "evicted %s", pod)
		},
	}
}

// drainFailed is a drain of name that failed with err: the node is uncordoned
// again and the run pauses, its reason ending with kept. A drain cancelled
// (the runner itself evicted, or stopped) leaves the node cordoned by ichor,
// and the next run finishes it first.
func (e *Engine) drainFailed(ctx context.Context, stage, name, kept string, err error) error {
	if ctx.Err() != nil {
		return fmt.Errorf("stage %s: node %q: drain: %w", stage, name, ctx.Err())
	}

	if uerr := e.nodes.Uncordon(ctx, name); uerr != nil {
		err = errors.Join(err, uerr)
	}

	return e.pause(ctx, stage, name, withKept(err.Error()+" (uncordoned again)", kept),
		"make the pods evictable (kubectl get pdb -A; a pod with no controller must be moved by hand), or hold the node, then resume", err)
}

// drainUnderway is a node's drain whose evictions were all accepted: its pods
// are being deleted under their grace periods, and the drain goes on in the
// background, waiting for them to be gone, until join.
type drainUnderway struct {
	name    string
	done    chan struct{}
	cancel  context.CancelFunc
	evicted int
	err     error
}

// startDrain cordons the node (ensureCordoned) and drains it until every
// eviction is accepted, not until the pods are gone: what comes next may run
// while the pods stop (an install that leaves the node's pods running), and
// join waits for the rest before what may not (the reboot). A drain that
// fails before its evictions are accepted pauses as cordonAndDrain's does. A
// drain that evicts the runner's own pod (Last) runs to its end here: the
// runner goes with its pod. stop, deferred, ends a drain not joined.
func (e *Engine) startDrain(ctx context.Context, opts Options, stage, name string, own ownPod) (*drainUnderway, error) {
	if err := e.ensureCordoned(ctx, stage, name, ""); err != nil {
		return nil, err
	}

	d := e.drainer(ctx, opts, stage, name, own)

	dctx, cancel := context.WithCancel(ctx)
	u := &drainUnderway{name: name, done: make(chan struct{}), cancel: cancel}
	accepted := make(chan struct{})

	if d.Last == "" || name != opts.Self {
		var underway atomic.Bool // the node goes on: its pods' ends are said as its upgrade's

		d.Accepted = func() { // called at most once
			underway.Store(true)
			close(accepted)
		}

		evicted := d.OnEvicted
		d.OnEvicted = func(pod string) {
			if underway.Load() {
				e.node(stage, name, PhaseUpgrading, "evicted %s (its drain goes on beside the upgrade)", pod)

				return
			}

			evicted(pod)
		}
	}

	go func() {
		defer close(u.done)

		u.evicted, u.err = d.Drain(dctx, name)
	}()

	select {
	case <-accepted:
		e.node(stage, name, PhaseDraining, "every eviction accepted: going on while the pods stop")

		return u, nil
	case <-u.done:
		cancel()

		if u.err != nil {
			return nil, e.drainFailed(ctx, stage, name, "", u.err)
		}

		return u, nil
	}
}

// stop ends the drain's wait if it was not joined (the run paused or stopped
// first): the pods stop all the same.
func (u *drainUnderway) stop() {
	if u == nil {
		return
	}

	u.cancel()
	<-u.done
}

// join waits for the drain's pods to be gone (the drain's own bound) and
// returns how many it evicted, as cordonAndDrain does: a drain that failed meanwhile
// pauses, uncordoned again, its reason ending with kept; a node made
// schedulable during the drain is cordoned and drained again
// (cordonAndDrain).
func (e *Engine) join(ctx context.Context, opts Options, stage string, u *drainUnderway, kept string) (int, error) {
	name := u.name

	select {
	case <-u.done:
	case <-ctx.Done():
		u.stop()

		return 0, fmt.Errorf("stage %s: node %q: drain: %w", stage, name, ctx.Err())
	}

	u.cancel()

	if u.err != nil {
		return 0, e.drainFailed(ctx, stage, name, kept, u.err)
	}

	if ours, err := e.stillCordoned(ctx, stage, name, kept); err != nil || ours {
		return u.evicted, err
	}

	e.node(stage, name, PhaseCordoned, "made schedulable during its drain: cordoning and draining it again")

	more, err := e.cordonAndDrain(ctx, opts, stage, name, ownPodByStage, kept)

	return u.evicted + more, err
}

// HandOver is how the runner leaves its own node before that node's reboot
// without being evicted: an eviction fails its pod, and the Job creates the
// replacement only after its pod failure backoff (10 s), on the critical path.
// Instead a successor pod is started while the node's other pods are drained,
// and the run stops once it is up; the successor takes the lock and continues
// from the state. On a Talos with the lifecycle service the runner stays through
// its node's drain and install, and hands over right before the reboot
// (ownPodUntilReboot): the successor starts while the node installs, and goes
// on with the reboot. On an older Talos, whose one Upgrade call installs and
// reboots, it hands over at the drain, and the successor goes on with the
// install.
type HandOver interface {
	// Prepare asks for a successor pod: called once the drain of Self, which
	// is cordoned, starts, and again at the drain right before the reboot
	// (a successor already asked for stays asked for). It returns once asked;
	// a failure is said, and Complete then returns false.
	Prepare(ctx context.Context)
	// Complete waits, bounded, for the successor: true means it runs and the
	// run stops here (ctx is cancelled before Complete returns); false means
	// there is none, and the drain evicts the runner's pod as it would have.
	Complete(ctx context.Context) bool
}
