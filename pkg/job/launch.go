package job

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"time"

	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	api "github.com/ichor-dev/kubectl-ichor/pkg/api/v1alpha1"
)

// LaunchRequest is a new operation to launch.
type LaunchRequest struct {
	// Spec is the operation; CreatedAt is set when zero.
	Spec api.OperationSpec
	// Plan is the plan the operator confirmed (JSON).
	Plan []byte
	// Talosconfig is the operator's talosconfig, copied for CredentialsLocal.
	Talosconfig []byte
	// Memo is the engine's memory to start from (the plan's etcd passes: see
	// engine.EtcdPassMemo).
	Memo map[string]string
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
	op.Status.Memo = maps.Clone(req.Memo)
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

	// Talos' write of the Secret wakes the wait at once; the poll stays for the
	// refusal, and for an apiserver that refuses the watch.
	wake := newWake(wctx, c.Kube.CoreV1().Secrets(c.Namespace).Watch, TalosAccountName)
	defer wake.Stop()

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

		wake.Next(wctx, c.poll()/2)

		if wctx.Err() != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}

			return refused(timeout, c.talosAccountFailure(ctx))
		}
	}
}

// WatchState wakes a follower of the state ConfigMap at each of its writes (Wake).
func (c *Control) WatchState(ctx context.Context) *Wake {
	return newWake(ctx, c.Kube.CoreV1().ConfigMaps(c.Namespace).Watch, StateName)
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
