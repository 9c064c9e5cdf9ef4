package job

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"

	api "github.com/ichor-dev/kubectl-ichor/pkg/api/v1alpha1"
)

// BusyError refuses to start an operation while another one is in progress.
type BusyError struct {
	// Namespace is the product's namespace.
	Namespace string
	// Operation is the operation in progress, Phase its phase, Age how long ago it was
	// launched.
	Operation string
	Phase     api.Phase
	Age       time.Duration
	// Holder is the runner pod holding the lock, "<namespace>/<pod>" ("" when none does).
	Holder string
	// Job is the operation's current Job.
	Job string
	// Reason is why a Paused operation paused.
	Reason string
	// Elsewhere is true when the operation is in another namespace than the one asked
	// about.
	Elsewhere bool
}

// Error implements error, on one line, saying what to do.
func (e *BusyError) Error() string {
	n := nsFlag(e.Namespace)
	what := fmt.Sprintf("operation %s (%s, launched %s ago)", e.Operation, e.Phase, e.Age)

	if e.Elsewhere {
		what = fmt.Sprintf("operation %s in namespace %s (%s, launched %s ago)", e.Operation, e.Namespace, e.Phase, e.Age)
	}

	if e.Operation == "" {
		what = "an operation in namespace " + e.Namespace
	}

	switch {
	case e.Holder != "":
		return fmt.Sprintf("%s holds the lock %s (holder: pod %s): one operation per cluster; follow it with kubectl ichor status --watch%s, or stop it with kubectl ichor abort%s",
			what, describe("lease", LockNamespace, LockName), e.Holder, n, n)
	case e.Phase == api.PhasePaused:
		reason := ""
		if e.Reason != "" {
			reason = ": " + strings.TrimSuffix(e.Reason, ".")
		}

		return fmt.Sprintf("%s is paused%s: continue it with kubectl ichor resume%s, or stop it with kubectl ichor abort%s", what, reason, n, n)
	case e.Job != "":
		return fmt.Sprintf("%s is starting in job %s/%s: follow it with kubectl ichor status --watch%s, or stop it with kubectl ichor abort%s",
			what, e.Namespace, e.Job, n, n)
	}

	return fmt.Sprintf("%s is being launched: follow it with kubectl ichor status --watch%s, or stop it with kubectl ichor abort%s", what, n, n)
}

// CheckFree returns nil when a new operation may start: none is in progress in this
// namespace nor in another one, since one operation at a time may change a cluster: the
// lock (in LockNamespace) held by a live runner of any namespace refuses, and so does an
// operation in progress in any namespace. Otherwise a *BusyError names the operation,
// its age and the lock's holder. An error reading the lock or listing the operations is
// returned: it is no proof that the cluster is free.
func (c *Control) CheckFree(ctx context.Context) error {
	op, err := c.Get(ctx)

	switch {
	case errors.Is(err, ErrNoOperation):
	case err != nil:
		return err
	default:
		if err := c.Busy(ctx, op); err != nil {
			return err
		}
	}

	if err := c.checkLockHolder(ctx); err != nil {
		return err
	}

	return c.checkOtherNamespaces(ctx)
}

// checkLockHolder refuses when a live runner of another namespace holds the lock.
func (c *Control) checkLockHolder(ctx context.Context) error {
	holder, lock, err := liveHolder(ctx, c.Kube, c.now())
	if err != nil {
		return fmt.Errorf("%w: one operation per cluster, so a new one starts only once the lock is known to be free", err)
	}

	ns := lock.HolderNamespace()
	if holder == "" || ns == c.Namespace {
		return nil
	}

	other := *c
	other.Namespace = ns

	busy := &BusyError{Namespace: ns, Holder: holder, Elsewhere: true}

	if op, err := other.Get(ctx); err == nil {
		busy.Operation, busy.Phase, busy.Age, busy.Job = op.Spec.ID, op.Status.Phase, op.Age(c.now()), op.Status.Job
	}

	return busy
}

// checkOtherNamespaces refuses when an operation is in progress in another namespace.
// An error listing the operations (ConfigMaps across namespaces) is returned.
func (c *Control) checkOtherNamespaces(ctx context.Context) error {
	list, err := c.Kube.CoreV1().ConfigMaps(metav1.NamespaceAll).List(ctx, metav1.ListOptions{
		LabelSelector: labels.Set{LabelManagedBy: AppName}.String(),
		FieldSelector: "metadata.name=" + StateName,
	})
	if err != nil {
		return fmt.Errorf("list the operations of every namespace (configmaps named %s): %w; one operation per cluster, "+
			"so a new one starts only with that list: run it with credentials that may list configmaps in all namespaces", StateName, err)
	}

	for i := range list.Items {
		cm := &list.Items[i]
		if cm.Namespace == c.Namespace || cm.Name != StateName {
			continue
		}

		op, err := DecodeState(cm)
		if err != nil || op.Status.Phase.Finished() {
			continue
		}

		other := *c
		other.Namespace = cm.Namespace

		if err := other.Busy(ctx, op); err != nil {
			var busy *BusyError
			if errors.As(err, &busy) {
				busy.Elsewhere = true
			}

			return err
		}
	}

	return nil
}

// Busy returns nil when op may be replaced by a new operation (it finished, or it was
// abandoned: no runner holds the lock, no Job of it is active, and it was not launched
// just now), else a *BusyError.
func (c *Control) Busy(ctx context.Context, op *api.Operation) error {
	if op.Status.Phase.Finished() {
		return nil
	}

	now := c.now()
	busy := &BusyError{Namespace: c.Namespace, Operation: op.Spec.ID, Phase: op.Status.Phase, Age: op.Age(now), Job: op.Status.Job, Reason: op.Status.Reason}

	holder, lock, err := liveHolder(ctx, c.Kube, now)
	if err != nil {
		return err
	}

	if holder != "" && lock.HolderNamespace() == c.Namespace {
		busy.Holder = holder

		return busy
	}

	if op.Status.Phase == api.PhasePaused {
		return busy
	}

	active, err := c.jobActive(ctx, op.Status.Job)
	if err != nil {
		return err
	}

	if active {
		return busy
	}

	if op.Status.UpdatedAt != nil && now.Sub(op.Status.UpdatedAt.Time) < launchGrace {
		busy.Job = ""

		return busy
	}

	return nil
}

// WaitJobEnded waits, up to timeout, for the Job called name to end, and reports
// whether it did: a runner that wrote its operation's end in the state still releases
// the lock and removes its credentials before its pod, and so its Job, ends.
//
// The Job has ended when it is Complete or Failed, or gone, or, sooner, when its pods
// say so (jobPodsActive): the Job controller sets Complete only at its next sync of the
// Job, up to its batch period (kube-controller-manager's SyncJobBatchPeriod, 1 s) after
// the runner's pod ended. The Job's pods are watched; the poll stays for a watch
// refused or ended.
func (c *Control) WaitJobEnded(ctx context.Context, name string, timeout time.Duration) (bool, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()

	wake := newWakeOn(ctx, c.Kube.CoreV1().Pods(c.Namespace).Watch, metav1.ListOptions{LabelSelector: jobPods(name)})
	defer wake.Stop()

	for {
		active, err := c.jobActive(ctx, name)
		if err == nil && active {
			active, err = c.jobPodsActive(ctx, name)
		}

		if err == nil && !active {
			return true, nil
		}

		wake.Next(ctx, c.poll())

		if ctx.Err() != nil {
			return false, err
		}
	}
}

// jobPods selects the pods of the Job called name.
func jobPods(name string) string {
	return labels.Set{"job-name": name}.String()
}

// jobPodsActive reports whether the Job called name may still run a pod, by its pods:
// false once one of them succeeded and none is still pending or running. The runner's
// Job leaves completions unset, and such a Job is complete once a pod succeeded and
// every pod ended: it starts no other. A Job none of whose pods succeeded may start
// another (a runner that crashed), so it is active.
func (c *Control) jobPodsActive(ctx context.Context, name string) (bool, error) {
	pods, err := c.Kube.CoreV1().Pods(c.Namespace).List(ctx, metav1.ListOptions{LabelSelector: jobPods(name)})
	if err != nil {
		return true, fmt.Errorf("list the pods of %s: %w", describe("job", c.Namespace, name), err)
	}

	succeeded := false

	for i := range pods.Items {
		p := &pods.Items[i]

		switch p.Status.Phase {
		case corev1.PodSucceeded:
			succeeded = true
		case corev1.PodFailed:
		default:
			return true, nil
		}
	}

	return !succeeded, nil
}

// jobActive reports whether the Job exists and has not finished.
func (c *Control) jobActive(ctx context.Context, name string) (bool, error) {
	if name == "" {
		return false, nil
	}

	j, err := c.Kube.BatchV1().Jobs(c.Namespace).Get(ctx, name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return false, nil
	}

	if err != nil {
		return false, fmt.Errorf("read %s: %w", describe("job", c.Namespace, name), err)
	}

	_, finished := jobFinished(j)

	return !finished, nil
}
