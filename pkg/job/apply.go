package job

import (
	"context"
	"errors"
	"fmt"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
)

// TalosAccountResource is the resource of Talos' ServiceAccounts.
var TalosAccountResource = schema.GroupVersionResource{Group: "talos.dev", Version: "v1alpha1", Resource: "serviceaccounts"}

// applier server-side applies the plugin's objects with its field manager, taking over
// fields another manager set: Kubernetes' kinds through the typed client, Talos'
// ServiceAccount through the dynamic one.
type applier struct {
	kube kubernetes.Interface
	dyn  dynamic.Interface
}

func (a applier) apply(ctx context.Context, obj runtime.Object) error {
	m, err := runtime.DefaultUnstructuredConverter.ToUnstructured(obj)
	if err != nil {
		return fmt.Errorf("encode %T: %w", obj, err)
	}

	cleanUnstructured(m)

	u := &unstructured.Unstructured{Object: m}

	what := describe(u.GetKind(), u.GetNamespace(), u.GetName())

	data, err := u.MarshalJSON()
	if err != nil {
		return fmt.Errorf("apply %s: %w", what, err)
	}

	name, ns := u.GetName(), u.GetNamespace()
	opts := metav1.PatchOptions{FieldManager: FieldManager, Force: ptrTo(true)}
	core, rbac := a.kube.CoreV1(), a.kube.RbacV1()

	switch obj.(type) {
	case *corev1.Namespace:
		_, err = core.Namespaces().Patch(ctx, name, types.ApplyPatchType, data, opts)
	case *corev1.ServiceAccount:
		_, err = core.ServiceAccounts(ns).Patch(ctx, name, types.ApplyPatchType, data, opts)
	case *corev1.Secret:
		_, err = core.Secrets(ns).Patch(ctx, name, types.ApplyPatchType, data, opts)
	case *corev1.ConfigMap:
		_, err = core.ConfigMaps(ns).Patch(ctx, name, types.ApplyPatchType, data, opts)
	case *rbacv1.ClusterRole:
		_, err = rbac.ClusterRoles().Patch(ctx, name, types.ApplyPatchType, data, opts)
	case *rbacv1.ClusterRoleBinding:
		_, err = rbac.ClusterRoleBindings().Patch(ctx, name, types.ApplyPatchType, data, opts)
	case *rbacv1.Role:
		_, err = rbac.Roles(ns).Patch(ctx, name, types.ApplyPatchType, data, opts)
	case *rbacv1.RoleBinding:
		_, err = rbac.RoleBindings(ns).Patch(ctx, name, types.ApplyPatchType, data, opts)
	case *batchv1.Job:
		_, err = a.kube.BatchV1().Jobs(ns).Patch(ctx, name, types.ApplyPatchType, data, opts)
	case *unstructured.Unstructured:
		if u.GroupVersionKind().GroupVersion().WithResource("serviceaccounts") != TalosAccountResource {
			return fmt.Errorf("apply %s: kind not known to kubectl-ichor", what)
		}

		_, err = a.dyn.Resource(TalosAccountResource).Namespace(ns).Apply(ctx, name, u, metav1.ApplyOptions{FieldManager: FieldManager, Force: true})
	default:
		return fmt.Errorf("apply %s: kind not known to kubectl-ichor", what)
	}

	if err != nil {
		return fmt.Errorf("apply %s: %w", what, explain(err))
	}

	return nil
}

// explain adds what to do to the API errors an operator can act on.
func explain(err error) error {
	switch {
	case apierrors.IsForbidden(err):
		return fmt.Errorf("%w: RBAC denied; launching creates a namespace, RBAC, credentials and a Job: "+
			"run it as a cluster admin, or have one apply the objects of manifests/", err)
	case isMissingResource(err):
		return fmt.Errorf("%w: the cluster does not serve this resource", err)
	}

	return err
}

// isMissingResource reports whether err is a NotFound about the resource type rather
// than an object (the server does not serve it).
func isMissingResource(err error) bool {
	if meta.IsNoMatchError(err) {
		return true
	}

	var status apierrors.APIStatus

	if !errors.As(err, &status) || !apierrors.IsNotFound(err) {
		return false
	}

	d := status.Status().Details

	return d == nil || d.Name == ""
}
