package job

import (
	"context"
	"fmt"
	"strings"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	api "github.com/ichor-dev/kubectl-ichor/pkg/api/v1alpha1"
)

// Resume continues an operation that paused, or whose runner stopped for good (its Job
// failed or is gone): it sets it Pending and starts a new Job (the next attempt), which
// continues from the cluster's state. talosconfig re-copies the operator's talosconfig
// for CredentialsLocal (nil keeps the copy in the cluster).
func (c *Control) Resume(ctx context.Context, talosconfig []byte) (*api.Operation, error) {
	op, err := c.Get(ctx)
	if err != nil {
		return nil, err
	}

	n := nsFlag(c.Namespace)

	switch op.Status.Phase {
	case api.PhaseSucceeded:
		return nil, fmt.Errorf("operation %s succeeded: nothing to resume", op.Spec.ID)
	case api.PhaseAborted:
		return nil, fmt.Errorf("operation %s was aborted: start a new one with kubectl ichor upgrade%s", op.Spec.ID, n)
	}

	holder, lock, err := liveHolder(ctx, c.Kube, c.now())
	if err != nil {
		return nil, err
	}

	if holder != "" && lock.HolderNamespace() == c.Namespace {
		return nil, fmt.Errorf("operation %s is running (pod %s holds the lock): nothing to resume; follow it with kubectl ichor status --watch%s",
			op.Spec.ID, holder, n)
	}

	if holder != "" {
		return nil, fmt.Errorf("operation %s cannot resume: pod %s holds the lock %s for an operation in namespace %s (one operation per cluster): "+
			"wait for it to end (kubectl ichor status -n %s), then run kubectl ichor resume%s again",
			op.Spec.ID, holder, describe("lease", LockNamespace, LockName), lock.HolderNamespace(), lock.HolderNamespace(), n)
	}

	if op.Status.Phase != api.PhasePaused {
		running, err := c.jobRunning(ctx, op.Status.Job)
		if err != nil {
			return nil, err
		}

		if running != "" {
			return nil, fmt.Errorf("operation %s is %s in pod %s: nothing to resume; follow it with kubectl ichor status --watch%s",
				op.Spec.ID, strings.ToLower(string(op.Status.Phase)), running, n)
		}
	}

	previous := op.Status.Job
	attempt := op.Status.Attempt

	op, err = c.Store().Update(ctx, func(o *api.Operation) error {
		if o.Spec.ID != op.Spec.ID || o.Status.Attempt != attempt || o.Status.Phase.Finished() {
			return fmt.Errorf("operation %s changed while resuming it: look at kubectl ichor status%s", op.Spec.ID, n)
		}

		o.Status.Phase = api.PhasePending
		o.Status.Attempt = attempt + 1
		o.Status.Job = JobName(o.Spec.ID, o.Status.Attempt)
		o.Status.Reason, o.Status.Action, o.Status.PausedNode = "", "", ""

		return nil
	})
	if err != nil {
		return nil, err
	}

	if err := c.deleteJob(ctx, previous); err != nil {
		return nil, err
	}

	if op.Spec.Credentials == api.CredentialsLocal && talosconfig == nil {
		if _, err := c.Kube.CoreV1().Secrets(c.Namespace).Get(ctx, LocalTalosconfigName, metav1.GetOptions{}); err != nil {
			return nil, fmt.Errorf("read %s: %w: the copy of your talosconfig is gone, resume with your talosconfig at hand",
				describe("secret", c.Namespace, LocalTalosconfigName), err)
		}
	}

	if talosconfig == nil && op.Spec.Credentials == api.CredentialsLocal {
		if err := c.startKeepingTalosconfig(ctx, op); err != nil {
			return nil, err
		}

		return op, nil
	}

	if err := c.start(ctx, op, talosconfig); err != nil {
		return nil, err
	}

	return op, nil
}

// startKeepingTalosconfig starts op's Job with the talosconfig copy already in the cluster.
func (c *Control) startKeepingTalosconfig(ctx context.Context, op *api.Operation) error {
	if _, err := c.applyRunner(ctx); err != nil {
		return err
	}

	return c.startJob(ctx, op)
}

// jobRunning returns a pod of the Job that has not ended, "" when none.
func (c *Control) jobRunning(ctx context.Context, name string) (string, error) {
	if name == "" {
		return "", nil
	}

	pods, err := c.Kube.CoreV1().Pods(c.Namespace).List(ctx, metav1.ListOptions{LabelSelector: jobPods(name)})
	if err != nil {
		return "", fmt.Errorf("list the pods of %s: %w", describe("job", c.Namespace, name), err)
	}

	for _, p := range pods.Items {
		if p.Status.Phase != corev1.PodSucceeded && p.Status.Phase != corev1.PodFailed && p.DeletionTimestamp == nil {
			return p.Name, nil
		}
	}

	return "", nil
}
