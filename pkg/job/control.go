package job

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"

	api "github.com/ichor-dev/kubectl-ichor/pkg/api/v1alpha1"
)

// Default bounds of Control.
const (
	// DefaultCredentialsTimeout bounds the wait for Talos to write the Job's credentials.
	DefaultCredentialsTimeout = time.Minute
	// DefaultStopTimeout bounds abort's wait for the runner to stop: its grace period,
	// then the lock's expiry.
	DefaultStopTimeout = TerminationGrace*time.Second + LeaseDuration + 15*time.Second
)

// Control is the operator's handle on the operations of one namespace: it launches,
// resumes and aborts them, and keeps to one operation at a time.
type Control struct {
	// Kube and Dynamic reach the cluster with the operator's credentials.
	Kube    kubernetes.Interface
	Dynamic dynamic.Interface
	// Namespace is the product's namespace.
	Namespace string
	// Access is what the runner may do to re-apply the bootstrap manifests, computed from
	// them when the operation is launched or resumed (ComputeAccess); empty for a Talos
	// upgrade, which applies none. nil keeps the runner's permissions as they are when it
	// has them (a resume that could not read the manifests), else gives it none.
	Access *ManifestAccess
	// CredentialsTimeout bounds the wait for Talos' credentials Secret (0: the default).
	CredentialsTimeout time.Duration
	// StopTimeout bounds abort's wait for the runner to stop (0: the default).
	StopTimeout time.Duration
	// Poll is how often waits look again (0: one second).
	Poll time.Duration
	// Now is the clock; nil means time.Now.
	Now func() time.Time
}

func (c *Control) now() time.Time {
	if c.Now != nil {
		return c.Now()
	}

	return time.Now()
}

func (c *Control) poll() time.Duration {
	if c.Poll > 0 {
		return c.Poll
	}

	return time.Second
}

func (c *Control) applier() applier { return applier{kube: c.Kube, dyn: c.Dynamic} }

// Store is the state ConfigMap of the namespace.
func (c *Control) Store() *Store {
	return &Store{Client: c.Kube.CoreV1(), Namespace: c.Namespace, Now: c.Now}
}

// Get returns the namespace's operation (ErrNoOperation, wrapped, when there is none).
func (c *Control) Get(ctx context.Context) (*api.Operation, error) {
	op, _, err := c.Store().Get(ctx)

	return op, err
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

// jobFinished returns the condition that ended a Job, if any.
func jobFinished(j *batchv1.Job) (batchv1.JobCondition, bool) {
	for _, cond := range j.Status.Conditions {
		if (cond.Type == batchv1.JobComplete || cond.Type == batchv1.JobFailed) && cond.Status == corev1.ConditionTrue {
			return cond, true
		}
	}

	return batchv1.JobCondition{}, false
}

// LaunchRequest is a new operation to launch.
type LaunchRequest struct {
	// Spec is the operation; CreatedAt is set when zero.
	Spec api.OperationSpec
	// Plan is the plan the operator confirmed (JSON).
	Plan []byte
	// Talosconfig is the operator's talosconfig, copied for CredentialsLocal.
	Talosconfig []byte
}

// Launch creates, in this order: the namespace; the state ConfigMap (claiming the
// namespace for this operation: refused with a *BusyError while another is in progress);
// the runner's ServiceAccount and RBAC; the Talos credentials (waiting for Talos to write
// them); and the Job. When a step after the claim fails, the operation is marked Aborted
// with the reason, so that it does not block the next launch.
func (c *Control) Launch(ctx context.Context, req LaunchRequest) (*api.Operation, error) {
	if req.Spec.CreatedAt.IsZero() {
		req.Spec.CreatedAt = metav1.NewTime(c.now().UTC().Truncate(time.Second))
	}

	if err := c.applier().apply(ctx, Namespace(c.Namespace)); err != nil {
		return nil, err
	}

	op := api.NewOperation(req.Spec)
	op.Status.Attempt = 1
	launched := metav1.NewMicroTime(c.now().UTC())
	op.Status.LaunchedAt = &launched
	op.Status.Job = JobName(op.Spec.ID, 1)
	op.Status.UpdatedAt = ptrTime(c.now())

	if err := c.Store().Create(ctx, op, req.Plan, func(old *api.Operation) error { return c.Busy(ctx, old) }); err != nil {
		return nil, err
	}

	if err := c.start(ctx, op, req.Talosconfig); err != nil {
		_, _ = c.Store().Update(context.WithoutCancel(ctx), func(o *api.Operation) error {
			if o.Spec.ID != op.Spec.ID {
				return errReplaced
			}

			o.Status.Phase = api.PhaseAborted
			o.Status.Reason = "launch failed: " + err.Error()
			o.Status.FinishedAt = ptrTime(c.now())

			return nil
		})

		_, _ = c.RemoveCredentials(context.WithoutCancel(ctx))

		return nil, err
	}

	return op, nil
}

// start applies the runner's objects and credentials and creates the Job of op's current
// attempt.
func (c *Control) start(ctx context.Context, op *api.Operation, talosconfig []byte) error {
	owner, err := c.applyRunner(ctx)
	if err != nil {
		return err
	}

	switch op.Spec.Credentials {
	case api.CredentialsLocal:
		if len(talosconfig) == 0 {
			return errors.New("--talos-credentials=local: no talosconfig to copy")
		}

		if err := c.applier().apply(ctx, ownedBy(LocalTalosconfig(c.Namespace, op.Spec.ID, talosconfig), owner)); err != nil {
			return err
		}
	default:
		if err := c.applier().apply(ctx, ownedBy(TalosAccount(c.Namespace), owner)); err != nil {
			if isMissingResource(err) {
				return fmt.Errorf("the cluster does not serve talos.dev ServiceAccounts (Talos' Kubernetes API access is off): %s", accessAdvice(c.Namespace))
			}

			return fmt.Errorf("%w: %s", err, accessAdvice(c.Namespace))
		}

		if err := c.waitCredentials(ctx); err != nil {
			return err
		}
	}

	return c.startJob(ctx, op)
}

// applyRunner applies the runner's ClusterRole, then its other objects owned by it, and
// returns the owner reference of the ClusterRole: deleting it deletes them all.
func (c *Control) applyRunner(ctx context.Context) (*metav1.OwnerReference, error) {
	name := ClusterRoleName(c.Namespace)
	owner := func(cr *rbacv1.ClusterRole) *metav1.OwnerReference {
		return &metav1.OwnerReference{APIVersion: rbacv1.SchemeGroupVersion.String(), Kind: "ClusterRole", Name: name, UID: cr.UID}
	}

	var access ManifestAccess

	if c.Access != nil {
		access = *c.Access
	} else {
		cr, err := c.Kube.RbacV1().ClusterRoles().Get(ctx, name, metav1.GetOptions{})
		if err == nil {
			return owner(cr), nil
		}

		if !apierrors.IsNotFound(err) {
			return nil, fmt.Errorf("read %s: %w", describe("clusterrole", "", name), explain(err))
		}
	}

	objs := RunnerObjects(c.Namespace, access, nil)
	if err := c.applier().apply(ctx, objs[0]); err != nil {
		return nil, err
	}

	cr, err := c.Kube.RbacV1().ClusterRoles().Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", describe("clusterrole", "", name), explain(err))
	}

	for _, obj := range RunnerObjects(c.Namespace, access, owner(cr))[1:] {
		if err := c.applier().apply(ctx, obj); err != nil {
			return nil, err
		}
	}

	return owner(cr), nil
}

// waitCredentials waits until Talos wrote the talosconfig of its ServiceAccount.
func (c *Control) waitCredentials(ctx context.Context) error {
	timeout := c.CredentialsTimeout
	if timeout <= 0 {
		timeout = DefaultCredentialsTimeout
	}

	wctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()

	start := time.Now()

	refused := func(waited time.Duration, reason string) error {
		why := ""
		if reason != "" {
			why = " (Talos says: " + reason + ")"
		}

		return fmt.Errorf("talos did not write the credentials of talos.dev ServiceAccount %s/%s in %s%s: %s",
			c.Namespace, TalosAccountName, waited, why, accessAdvice(c.Namespace))
	}

	for {
		s, err := c.Kube.CoreV1().Secrets(c.Namespace).Get(wctx, TalosAccountName, metav1.GetOptions{})
		if err == nil && len(s.Data[TalosconfigKey]) > 0 {
			return nil
		}

		if err != nil && !apierrors.IsNotFound(err) && wctx.Err() == nil {
			return fmt.Errorf("read %s: %w", describe("secret", c.Namespace, TalosAccountName), explain(err))
		}

		// A refusal Talos wrote is trusted once Talos had time to look at the account
		// as applied now (an old refusal may stay until Talos reconciles it again).
		if waited := time.Since(start); waited >= credentialsRefusalGrace {
			if reason := c.talosAccountFailure(wctx); reason != "" {
				return refused(waited.Round(100*time.Millisecond), reason)
			}
		}

		select {
		case <-wctx.Done():
			if ctx.Err() != nil {
				return ctx.Err()
			}

			return refused(timeout, c.talosAccountFailure(ctx))
		case <-time.After(c.poll() / 2):
		}
	}
}

// accessAdvice says how to give the Job its Talos credentials.
func accessAdvice(namespace string) string {
	return fmt.Sprintf("enable machine.features.kubernetesTalosAPIAccess on the control planes with role %s and namespace %s "+
		"(kubectl ichor plan shows the patch), or pass --talos-credentials=local", TalosRole, namespace)
}

// credentialsRefusalGrace is how long after applying the Talos ServiceAccount a refusal
// written on it is believed.
const credentialsRefusalGrace = 5 * time.Second

// talosAccountFailure is Talos' reason for refusing the ServiceAccount, if it gave one.
func (c *Control) talosAccountFailure(ctx context.Context) string {
	u, err := c.Dynamic.Resource(TalosAccountResource).Namespace(c.Namespace).Get(ctx, TalosAccountName, metav1.GetOptions{})
	if err != nil {
		return ""
	}

	reason, _, _ := unstructured.NestedString(u.Object, "status", "failureReason")

	return reason
}

var errReplaced = errors.New("the operation was replaced by another")

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

	pods, err := c.Kube.CoreV1().Pods(c.Namespace).List(ctx, metav1.ListOptions{LabelSelector: "job-name=" + name})
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

func (c *Control) deleteJob(ctx context.Context, name string) error {
	if name == "" {
		return nil
	}

	err := c.Kube.BatchV1().Jobs(c.Namespace).Delete(ctx, name, metav1.DeleteOptions{PropagationPolicy: ptrTo(metav1.DeletePropagationBackground)})
	if err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("delete %s: %w", describe("job", c.Namespace, name), err)
	}

	return nil
}

func ptrTo[T any](v T) *T { return &v }

// Pods returns the pods of an operation's Jobs, oldest first.
func (c *Control) Pods(ctx context.Context, operation string) ([]corev1.Pod, error) {
	sel := labels.Set{LabelOperation: operation}.String()

	pods, err := c.Kube.CoreV1().Pods(c.Namespace).List(ctx, metav1.ListOptions{LabelSelector: sel})
	if err != nil {
		return nil, fmt.Errorf("list the pods of operation %s: %w", operation, err)
	}

	items := pods.Items
	sort.SliceStable(items, func(i, j int) bool {
		return items[i].CreationTimestamp.Before(&items[j].CreationTimestamp)
	})

	return items, nil
}

// Problem is something wrong with an operation's Job that its state does not show.
type Problem struct {
	// Message is one line saying what and what to do.
	Message string
	// Final is true when the Job will not run the operation any further (it failed):
	// only `resume` or `abort` moves it on.
	Final bool
}

// Diagnose looks at the Job of an unfinished operation for what its state cannot tell:
// a Job that failed without pausing the operation, a pod that cannot start or is not
// scheduled. It returns nil when nothing is wrong.
func (c *Control) Diagnose(ctx context.Context, op *api.Operation) (*Problem, error) {
	if op.Status.Phase.Finished() || op.Status.Phase == api.PhasePaused || op.Status.Job == "" {
		return nil, nil
	}

	n := nsFlag(c.Namespace)

	j, err := c.Kube.BatchV1().Jobs(c.Namespace).Get(ctx, op.Status.Job, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		if op.Status.UpdatedAt != nil && c.now().Sub(op.Status.UpdatedAt.Time) < launchGrace {
			return nil, nil
		}

		return &Problem{Final: true, Message: fmt.Sprintf("job %s/%s is gone while operation %s is %s: continue it with kubectl ichor resume%s",
			c.Namespace, op.Status.Job, op.Spec.ID, op.Status.Phase, n)}, nil
	}

	if err != nil {
		return nil, fmt.Errorf("read %s: %w", describe("job", c.Namespace, op.Status.Job), err)
	}

	if cond, finished := jobFinished(j); finished && cond.Type == batchv1.JobFailed {
		return &Problem{Final: true, Message: fmt.Sprintf("job %s/%s failed (%s: %s): read kubectl ichor logs%s, then continue with kubectl ichor resume%s",
			c.Namespace, j.Name, cond.Reason, oneLine(cond.Message), n, n)}, nil
	}

	pods, err := c.Kube.CoreV1().Pods(c.Namespace).List(ctx, metav1.ListOptions{LabelSelector: "job-name=" + j.Name})
	if err != nil {
		return nil, fmt.Errorf("list the pods of %s: %w", describe("job", c.Namespace, j.Name), err)
	}

	if p := newestPod(pods.Items); p != nil && p.Status.Phase == corev1.PodFailed && !hasDisruption(p) {
		why := ""

		for _, cs := range p.Status.ContainerStatuses {
			if t := cs.State.Terminated; t != nil {
				why = fmt.Sprintf(" (exit code %d)", t.ExitCode)
				if t.Message != "" {
					why = fmt.Sprintf(" (exit code %d: %s)", t.ExitCode, oneLine(t.Message))
				}
			}
		}

		return &Problem{Message: fmt.Sprintf("runner pod %s failed%s; the Job tries again (%d failures of %d allowed): read kubectl ichor logs%s",
			p.Name, why, j.Status.Failed, BackoffLimit, n)}, nil
	}

	for _, p := range pods.Items {
		if p.Status.Phase != corev1.PodPending {
			continue
		}

		for _, cs := range p.Status.ContainerStatuses {
			if w := cs.State.Waiting; w != nil && w.Reason != "" && w.Reason != "ContainerCreating" {
				return &Problem{Message: fmt.Sprintf("pod %s cannot start: %s: %s (is --image %s right?)", p.Name, w.Reason, oneLine(w.Message), op.Spec.Image)}, nil
			}
		}

		for _, cond := range p.Status.Conditions {
			if cond.Type == corev1.PodScheduled && cond.Status == corev1.ConditionFalse && cond.Reason == corev1.PodReasonUnschedulable {
				return &Problem{Message: fmt.Sprintf("pod %s is not scheduled: %s", p.Name, oneLine(cond.Message))}, nil
			}
		}
	}

	return nil, nil
}

func oneLine(s string) string { return strings.Join(strings.Fields(s), " ") }

// newestPod is the most recently created pod, nil for none.
func newestPod(pods []corev1.Pod) *corev1.Pod {
	var newest *corev1.Pod

	for i := range pods {
		if newest == nil || newest.CreationTimestamp.Before(&pods[i].CreationTimestamp) {
			newest = &pods[i]
		}
	}

	return newest
}

// hasDisruption reports whether a pod was stopped by a disruption (an eviction): the
// Job replaces it without counting a failure.
func hasDisruption(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.DisruptionTarget && c.Status == corev1.ConditionTrue {
			return true
		}
	}

	return false
}

// startJob creates op's Job. When no other node can host the runner
// (RunnerHosts), its pod tolerates the cordon and stays on its node through
// the drain: a pod evicted there would wait Pending for good.
func (c *Control) startJob(ctx context.Context, op *api.Operation) error {
	nodes, err := c.Kube.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		return fmt.Errorf("list the nodes (where can the runner run?): %w", err)
	}

	return c.applier().apply(ctx, Job(JobParams{
		Namespace: c.Namespace, Operation: op.Spec.ID, Attempt: op.Status.Attempt, Image: op.Spec.Image, Credentials: op.Spec.Credentials,
		StayOnNode: StaysOnNode(nodes.Items),
	}))
}
