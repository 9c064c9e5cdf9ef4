package job

import (
	"context"
	"fmt"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
)

// RemoveCredentials deletes everything that lets a runner of the namespace act, once its
// operation ended: the talos.dev ServiceAccount and the Secret Talos wrote for it (role
// os:admin), a copied talosconfig, the runner's ClusterRole, Roles, their bindings, and
// its ServiceAccount. The state ConfigMap, the Jobs (their logs) and the Lease stay. It
// returns what it deleted ("kind namespace/name").
func (c *Control) RemoveCredentials(ctx context.Context) ([]string, error) {
	var removed []string

	gone := func(what string, err error) error {
		switch {
		case err == nil:
			removed = append(removed, what)

			return nil
		case apierrors.IsNotFound(err) || isMissingResource(err):
			return nil
		default:
			return fmt.Errorf("delete %s: %w", what, err)
		}
	}

	ns := c.Namespace
	core, rbac := c.Kube.CoreV1(), c.Kube.RbacV1()

	if c.Dynamic != nil {
		err := c.Dynamic.Resource(TalosAccountResource).Namespace(ns).Delete(ctx, TalosAccountName, metav1.DeleteOptions{})
		if err := gone(describe("serviceaccount.talos.dev", ns, TalosAccountName), err); err != nil {
			return removed, err
		}
	}

	for _, name := range []string{TalosAccountName, LocalTalosconfigName} {
		if err := gone(describe("secret", ns, name), core.Secrets(ns).Delete(ctx, name, metav1.DeleteOptions{})); err != nil {
			return removed, err
		}
	}

	selector := labels.Set{LabelRunnerNamespace: ns}.String()

	bindings, err := rbac.RoleBindings(metav1.NamespaceAll).List(ctx, metav1.ListOptions{LabelSelector: selector})
	if err != nil {
		return removed, fmt.Errorf("list the runner's rolebindings: %w", err)
	}

	for _, b := range bindings.Items {
		if err := gone(describe("rolebinding", b.Namespace, b.Name), rbac.RoleBindings(b.Namespace).Delete(ctx, b.Name, metav1.DeleteOptions{})); err != nil {
			return removed, err
		}
	}

	roles, err := rbac.Roles(metav1.NamespaceAll).List(ctx, metav1.ListOptions{LabelSelector: selector})
	if err != nil {
		return removed, fmt.Errorf("list the runner's roles: %w", err)
	}

	for _, r := range roles.Items {
		if err := gone(describe("role", r.Namespace, r.Name), rbac.Roles(r.Namespace).Delete(ctx, r.Name, metav1.DeleteOptions{})); err != nil {
			return removed, err
		}
	}

	steps := []struct {
		what string
		del  func() error
	}{
		// The runner's cluster-scoped objects and its ServiceAccount, by name.
		{describe("clusterrolebinding", "", BindingName(ns)), func() error {
			return rbac.ClusterRoleBindings().Delete(ctx, BindingName(ns), metav1.DeleteOptions{})
		}},
		{describe("clusterrole", "", ClusterRoleName(ns)), func() error {
			return rbac.ClusterRoles().Delete(ctx, ClusterRoleName(ns), metav1.DeleteOptions{})
		}},
		{describe("serviceaccount", ns, RunnerName), func() error { return core.ServiceAccounts(ns).Delete(ctx, RunnerName, metav1.DeleteOptions{}) }},
	}

	for _, s := range steps {
		if err := gone(s.what, s.del()); err != nil {
			return removed, err
		}
	}

	return removed, nil
}

// RemoveLocalTalosconfig deletes the copy of the operator's talosconfig that
// --talos-credentials=local put in the namespace (the runner deletes it too once its
// operation succeeded, a moment after it says so). It says whether there was one.
func (c *Control) RemoveLocalTalosconfig(ctx context.Context) (bool, error) {
	err := c.Kube.CoreV1().Secrets(c.Namespace).Delete(ctx, LocalTalosconfigName, metav1.DeleteOptions{})

	switch {
	case err == nil:
		return true, nil
	case apierrors.IsNotFound(err):
		return false, nil
	default:
		return false, fmt.Errorf("delete %s: %w", describe("secret", c.Namespace, LocalTalosconfigName), err)
	}
}

// removeOwnCredentials is the runner's cleanup once its operation succeeded and it released
// the lock: it deletes its Talos credentials, then its own ClusterRole, which owns its
// other RBAC objects (the garbage collector deletes them; after that this runner can do
// nothing more). Its ServiceAccount stays, bound to nothing: a container of this pod that
// its kubelet restarts after this needs it to start at all, and then exits at once
// (Runner.Run). Failures are logged: kubectl ichor abort removes what is left.
func (r *Runner) removeOwnCredentials(ctx context.Context) {
	ns := r.Namespace
	failed := false

	step := func(what string, err error) {
		switch {
		case err == nil:
			r.logf("deleted %s", what)
		case apierrors.IsNotFound(err) || isMissingResource(err):
		default:
			failed = true

			r.logf("could not delete %s: %v", what, err)
		}
	}

	if r.Dynamic != nil {
		step(describe("serviceaccount.talos.dev", ns, TalosAccountName),
			r.Dynamic.Resource(TalosAccountResource).Namespace(ns).Delete(ctx, TalosAccountName, metav1.DeleteOptions{}))
	}

	for _, name := range []string{TalosAccountName, LocalTalosconfigName} {
		step(describe("secret", ns, name), r.Kube.CoreV1().Secrets(ns).Delete(ctx, name, metav1.DeleteOptions{}))
	}

	step(describe("clusterrole", "", ClusterRoleName(ns))+" (with the runner's bindings and roles it owns)",
		r.Kube.RbacV1().ClusterRoles().Delete(ctx, ClusterRoleName(ns), metav1.DeleteOptions{PropagationPolicy: ptrTo(metav1.DeletePropagationBackground)}))

	if failed {
		r.logf("some credentials are left: kubectl ichor abort%s removes them", nsFlag(ns))
	}
}
