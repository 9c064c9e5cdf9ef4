package job

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"

	api "github.com/ichor-dev/kubectl-ichor/pkg/api/v1alpha1"
	"github.com/ichor-dev/kubectl-ichor/pkg/discovery"
	"github.com/ichor-dev/kubectl-ichor/pkg/kube"
)

// AbortResult is what Abort did.
type AbortResult struct {
	// Operation is the aborted operation: from the state, or, when the state is
	// missing, from the labels of its newest Job ("" when neither tells).
	Operation string
	// Was is its phase before ("" when the state could not say; Succeeded when the
	// state is missing and the operation's last Job completed).
	Was api.Phase
	// Jobs are the Jobs deleted.
	Jobs []string
	// Uncordoned are the nodes uncordoned.
	Uncordoned []string
	// KeptHeld are the held nodes (discovery.HoldAnnotation) that ichor cordoned and
	// abort left cordoned: an upgrade that succeeded left them so on purpose, and
	// their state is the operator's to judge.
	KeptHeld []string
	// Released is true when the lock had a holder that abort cleared.
	Released bool
	// StateErr is the state ConfigMap's error when it could not be read (it is kept as is).
	StateErr error
	// StateMissing is true when the namespace had no state ConfigMap: what an
	// operation left was found by its labels.
	StateMissing bool
	// Removed are the credentials deleted (RemoveCredentials).
	Removed []string
	// Path are the hops of an aborted path (UpgradeCluster), HopsDone those of them
	// done before the abort.
	Path     []api.HopSpec
	HopsDone []api.HopStatus
}

// nothing reports whether abort found nothing to do.
func (r *AbortResult) nothing() bool {
	return r.Operation == "" && len(r.Jobs) == 0 && len(r.Uncordoned) == 0 && len(r.KeptHeld) == 0 && !r.Released && len(r.Removed) == 0
}

// Abort stops an operation for good and leaves the cluster as ready as it can: it marks
// the operation Aborted (the runner stops at its next write), deletes its Jobs and their
// pods, waits until the runner stopped (the lock is free or expired), uncordons every
// node the engine cordoned (kube.CordonedAnnotation), releases the lock and removes the
// runner's credentials (RemoveCredentials). The state ConfigMap stays, for the record.
//
// A succeeded operation stays Succeeded: abort only uncordons what ichor left cordoned
// and removes what is left of its credentials. A held node ichor cordoned stays
// cordoned after a success (an upgrade leaves it so on purpose) and whenever the state
// cannot say the operation did not finish; it is returned in KeptHeld.
//
// A state that cannot be read does not stop an abort. A corrupted one: the Jobs
// kubectl-ichor manages in the namespace are stopped. A missing one (deleted by hand,
// pruned by a GitOps tool, maybe while its runner is paused with a node cordoned and
// the os:admin credentials in place): the operation is found by its Jobs' labels
// (lostOperation) and cleaned up as above, unless an operation of another namespace is
// in progress, whose cordons those may be; with nothing left at all it is
// ErrNoOperation.
func (c *Control) Abort(ctx context.Context) (*AbortResult, error) {
	res := &AbortResult{}

	op, err := c.Get(ctx)

	var corrupt *CorruptStateError

	switch {
	case errors.As(err, &corrupt):
		res.StateErr = err
	case errors.Is(err, ErrNoOperation):
		if err := c.busyElsewhere(ctx); err != nil {
			return nil, err
		}

		res.StateMissing = true

		succeeded := false
		if res.Operation, succeeded, err = c.lostOperation(ctx); err != nil {
			return nil, err
		}

		if succeeded {
			// Its runner ended it: nothing to stop, and its Jobs stay for the record.
			res.Was = api.PhaseSucceeded

			return c.cleanUpSucceeded(ctx, res)
		}
	case err != nil:
		return nil, err
	case op.Status.Phase == api.PhaseSucceeded:
		// Nothing to stop: abort cleans up what the end may have left (the runner removes
		// its credentials itself, but it may have failed to), and the phase stays.
		res.Operation, res.Was = op.Spec.ID, op.Status.Phase

		return c.cleanUpSucceeded(ctx, res)
	default:
		res.Operation, res.Was = op.Spec.ID, op.Status.Phase
		res.Path, res.HopsDone = op.Spec.Hops, op.Status.HopsDone()

		if err := c.markAborted(ctx, op); err != nil {
			return nil, err
		}
	}

	selector := labels.Set{LabelManagedBy: AppName}
	if res.Operation != "" {
		selector[LabelOperation] = res.Operation
	}

	// A missing state whose operation left no Job leaves no Job to stop: the others are
	// ended operations', kept for their logs.
	if !res.StateMissing || res.Operation != "" {
		if res.Jobs, err = c.stopJobs(ctx, selector.String()); err != nil {
			return nil, err
		}
	}

	lock, err := c.waitStopped(ctx, selector.String())
	if err != nil {
		return nil, err
	}

	// Only a state that says the operation had not finished makes a held node's cordon
	// this abort's to lift.
	if res.Uncordoned, res.KeptHeld, err = c.uncordonAll(ctx, op == nil); err != nil {
		return nil, err
	}

	if lock != nil && lock.Holder != "" && lock.HolderNamespace() == c.Namespace {
		if err := releaseLock(ctx, c.Kube, lock); err != nil {
			return nil, err
		}

		res.Released = true
	}

	if res.Removed, err = c.RemoveCredentials(ctx); err != nil {
		return nil, err
	}

	if res.StateMissing && res.nothing() {
		return nil, fmt.Errorf("%w in namespace %s (no configmap %s) and nothing of one is left: nothing to abort; "+
			"pass -n with the namespace it runs in", ErrNoOperation, c.Namespace, StateName)
	}

	return res, nil
}

// markAborted marks op Aborted in the state: its runner stops at its next write.
func (c *Control) markAborted(ctx context.Context, op *api.Operation) error {
	if op.Status.Phase == api.PhaseAborted {
		return nil
	}

	_, err := c.Store().Update(ctx, func(o *api.Operation) error {
		if o.Spec.ID != op.Spec.ID {
			return errReplaced
		}

		o.Status.Phase = api.PhaseAborted
		o.Status.Reason = "aborted with kubectl ichor abort"
		o.Status.Action = ""
		o.Status.FinishedAt = ptrTime(c.now())

		return nil
	})

	return err
}

// cleanUpSucceeded is the abort of an operation that succeeded: it uncordons the nodes
// ichor left cordoned but the held ones, and removes what is left of its credentials.
func (c *Control) cleanUpSucceeded(ctx context.Context, res *AbortResult) (*AbortResult, error) {
	var err error

	if res.Uncordoned, res.KeptHeld, err = c.uncordonAll(ctx, true); err != nil {
		return nil, err
	}

	if res.Removed, err = c.RemoveCredentials(ctx); err != nil {
		return nil, err
	}

	return res, nil
}

// busyElsewhere returns a refusal when an operation of another namespace is in
// progress (or its runner holds the lock): the nodes ichor cordoned are then its own,
// and an abort here without a state to go by must not uncordon them.
func (c *Control) busyElsewhere(ctx context.Context) error {
	err := c.checkLockHolder(ctx)
	if err == nil {
		err = c.checkOtherNamespaces(ctx)
	}

	var busy *BusyError

	switch {
	case err == nil:
		return nil
	case errors.As(err, &busy):
		return fmt.Errorf("no operation in namespace %s (no configmap %s), and %w; nothing was stopped or uncordoned", c.Namespace, StateName, err)
	default:
		return fmt.Errorf("no operation in namespace %s (no configmap %s), and whether one of another namespace owns the nodes ichor cordoned "+
			"is unknown: %w; nothing was stopped or uncordoned", c.Namespace, StateName, err)
	}
}

// lostOperation is the operation a missing state held, as its Jobs' labels tell: the
// one of the newest Job kubectl-ichor manages in the namespace, leaving out the
// operations the history records as ended (each launch and resume creates a Job newer
// than every one before, and the state holds the newest operation). succeeded is true
// when that Job completed: its runner ended with the operation Succeeded. "" when no
// Job is left.
func (c *Control) lostOperation(ctx context.Context) (id string, succeeded bool, err error) {
	list, err := c.Kube.BatchV1().Jobs(c.Namespace).List(ctx, metav1.ListOptions{LabelSelector: labels.Set{LabelManagedBy: AppName}.String()})
	if err != nil {
		return "", false, fmt.Errorf("list the jobs in namespace %s: %w", c.Namespace, err)
	}

	ended := map[string]bool{}

	// An unreadable history only leaves more Jobs to choose from.
	if records, err := c.Store().History(ctx); err == nil {
		for _, r := range records {
			ended[r.Operation.Spec.ID] = true
		}
	}

	var newest *batchv1.Job

	for i := range list.Items {
		j := &list.Items[i]
		if op := j.Labels[LabelOperation]; op == "" || ended[op] {
			continue
		}

		if newest == nil || newest.CreationTimestamp.Before(&j.CreationTimestamp) {
			newest = j
		}
	}

	if newest == nil {
		return "", false, nil
	}

	cond, finished := jobFinished(newest)

	return newest.Labels[LabelOperation], finished && cond.Type == batchv1.JobComplete, nil
}

// stopJobs deletes the Jobs that match selector and their pods (which get their grace
// period to stop the engine and release the lock).
func (c *Control) stopJobs(ctx context.Context, selector string) ([]string, error) {
	list, err := c.Kube.BatchV1().Jobs(c.Namespace).List(ctx, metav1.ListOptions{LabelSelector: selector})
	if err != nil {
		return nil, fmt.Errorf("list the jobs in namespace %s: %w", c.Namespace, err)
	}

	var names []string

	for _, j := range list.Items {
		if err := c.deleteJob(ctx, j.Name); err != nil {
			return nil, err
		}

		names = append(names, j.Name)
	}

	pods, err := c.Kube.CoreV1().Pods(c.Namespace).List(ctx, metav1.ListOptions{LabelSelector: selector})
	if err != nil {
		return nil, fmt.Errorf("list the pods in namespace %s: %w", c.Namespace, err)
	}

	for _, p := range pods.Items {
		if p.DeletionTimestamp != nil {
			continue
		}

		err := c.Kube.CoreV1().Pods(c.Namespace).Delete(ctx, p.Name, metav1.DeleteOptions{})
		if err != nil && !apierrors.IsNotFound(err) {
			return nil, fmt.Errorf("delete %s: %w", describe("pod", c.Namespace, p.Name), err)
		}
	}

	sort.Strings(names)

	return names, nil
}

// waitStopped waits until no runner can change anything any more: no pod matching
// selector runs and no live holder keeps the lock. It returns the lock as last read.
func (c *Control) waitStopped(ctx context.Context, selector string) (*Lock, error) {
	timeout := c.StopTimeout
	if timeout <= 0 {
		timeout = DefaultStopTimeout
	}

	wctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()

	for {
		running, err := c.runningPod(wctx, selector)
		if err == nil && running == "" {
			var lock *Lock

			lock, err = ReadLock(wctx, c.Kube)
			if err == nil {
				var (
					holder string
					live   *Lock
				)

				// A runner of another namespace holding the lock is not this one.
				if holder, live, err = liveHolder(wctx, c.Kube, c.now()); err == nil && (holder == "" || live.HolderNamespace() != c.Namespace) {
					return lock, nil
				}

				running = holder
			}
		}

		select {
		case <-wctx.Done():
			if ctx.Err() != nil {
				return nil, ctx.Err()
			}

			if err != nil {
				return nil, err
			}

			return nil, fmt.Errorf("the runner (pod %s/%s) did not stop in %s: its node may be unreachable; "+
				"once it is gone, run kubectl ichor abort%s again to uncordon the nodes and release the lock",
				c.Namespace, running, timeout, nsFlag(c.Namespace))
		case <-time.After(c.poll()):
		}
	}
}

// runningPod returns a pod matching selector that has not ended, "" when none.
func (c *Control) runningPod(ctx context.Context, selector string) (string, error) {
	pods, err := c.Kube.CoreV1().Pods(c.Namespace).List(ctx, metav1.ListOptions{LabelSelector: selector})
	if err != nil {
		return "", fmt.Errorf("list the pods in namespace %s: %w", c.Namespace, err)
	}

	for _, p := range pods.Items {
		if p.Status.Phase != corev1.PodSucceeded && p.Status.Phase != corev1.PodFailed {
			return p.Name, nil
		}
	}

	return "", nil
}

// uncordonAll uncordons every node the engine cordoned (kube.CordonedAnnotation) and
// removes the mark, but, with keepHeld, a held node (discovery.HoldAnnotation) that is
// still cordoned: it stays so and is returned in kept.
func (c *Control) uncordonAll(ctx context.Context, keepHeld bool) (done, kept []string, err error) {
	nodes, err := c.Kube.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, nil, fmt.Errorf("list nodes: %w", err)
	}

	for _, n := range nodes.Items {
		if !kube.CordonedByIchor(&n) {
			continue
		}

		if _, held := n.Annotations[discovery.HoldAnnotation]; held && keepHeld {
			if n.Spec.Unschedulable {
				kept = append(kept, n.Name)
			}

			continue
		}

		if err := kube.Uncordon(ctx, c.Kube, n.Name); err != nil {
			return done, kept, err
		}

		done = append(done, n.Name)
	}

	return done, kept, nil
}
