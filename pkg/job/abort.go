package job

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"

	"github.com/ichor-dev/kubectl-ichor/pkg/kube"
)

// AbortResult is what Abort did.
type AbortResult struct {
	// Operation is the aborted operation ("" when the state was corrupted).
	Operation string
	// Was is its phase before.
	Was Phase
	// Jobs are the Jobs deleted.
	Jobs []string
	// Uncordoned are the nodes uncordoned.
	Uncordoned []string
	// Released is true when the lock had a holder that abort cleared.
	Released bool
	// StateErr is the state ConfigMap's error when it could not be read (it is kept as is).
	StateErr error
	// Removed are the credentials deleted (RemoveCredentials).
	Removed []string
}

// Abort stops an operation for good and leaves the cluster as ready as it can: it marks
// the operation Aborted (the runner stops at its next write), deletes its Jobs and their
// pods, waits until the runner stopped (the lock is free or expired), uncordons every
// node the engine cordoned (kube.CordonedAnnotation), releases the lock and removes the
// runner's credentials (RemoveCredentials). The state ConfigMap stays, for the record. A
// corrupted state does not stop an abort: the Jobs kubectl-ichor manages in the namespace
// are stopped instead. A succeeded operation stays Succeeded: abort only uncordons what
// ichor left cordoned and removes what is left of its credentials.
func (c *Control) Abort(ctx context.Context) (*AbortResult, error) {
	res := &AbortResult{}

	op, err := c.Get(ctx)

	var corrupt *CorruptStateError

	switch {
	case errors.As(err, &corrupt):
		res.StateErr = err
	case err != nil:
		return nil, err
	case op.Status.Phase == PhaseSucceeded:
		// Nothing to stop: abort cleans up what the end may have left (the runner removes
		// its credentials itself, but it may have failed to), and the phase stays.
		res.Operation, res.Was = op.Spec.ID, op.Status.Phase

		if res.Uncordoned, err = c.uncordonAll(ctx); err != nil {
			return nil, err
		}

		if res.Removed, err = c.RemoveCredentials(ctx); err != nil {
			return nil, err
		}

		return res, nil
	default:
		res.Operation, res.Was = op.Spec.ID, op.Status.Phase

		if op.Status.Phase != PhaseAborted {
			_, err := c.Store().Update(ctx, func(o *Operation) error {
				if o.Spec.ID != op.Spec.ID {
					return errReplaced
				}

				o.Status.Phase = PhaseAborted
				o.Status.Reason = "aborted with kubectl ichor abort"
				o.Status.Action = ""
				o.Status.FinishedAt = ptrTime(c.now())

				return nil
			})
			if err != nil {
				return nil, err
			}
		}
	}

	selector := labels.Set{LabelManagedBy: AppName}
	if op != nil {
		selector[LabelOperation] = op.Spec.ID
	}

	jobs, err := c.stopJobs(ctx, selector.String())
	if err != nil {
		return nil, err
	}

	res.Jobs = jobs

	lock, err := c.waitStopped(ctx, selector.String())
	if err != nil {
		return nil, err
	}

	if res.Uncordoned, err = c.uncordonAll(ctx); err != nil {
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

	return res, nil
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
// removes the mark.
func (c *Control) uncordonAll(ctx context.Context) ([]string, error) {
	nodes, err := c.Kube.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, fmt.Errorf("list nodes: %w", err)
	}

	var done []string

	for _, n := range nodes.Items {
		if !kube.CordonedByIchor(&n) {
			continue
		}

		if err := kube.Uncordon(ctx, c.Kube, n.Name); err != nil {
			return done, err
		}

		done = append(done, n.Name)
	}

	return done, nil
}
