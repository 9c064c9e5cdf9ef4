package job

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	k8stesting "k8s.io/client-go/testing"

	api "github.com/ichor-dev/kubectl-ichor/pkg/api/v1alpha1"
)

func launchRequest(id string, creds api.Credentials) LaunchRequest {
	return LaunchRequest{
		Spec: api.OperationSpec{ID: id, Upgrade: api.UpgradeKubernetes, Target: "v1.36.3", MaxUnavailable: 1, Image: "img:v1", Credentials: creds},
		Plan: []byte(`{"kind":"Plan"}`),
	}
}

func TestLaunch(t *testing.T) {
	ctx := context.Background()
	f := newControl(t, t0, talosSecret())
	access := testAccess()
	f.ctl.Access = &access

	op, err := f.ctl.Launch(ctx, launchRequest("op-1", api.CredentialsServiceAccount))
	require.NoError(t, err)
	assert.Equal(t, "ichor-op-1-1", op.Status.Job)

	state, err := f.ctl.Get(ctx)
	require.NoError(t, err)
	assert.Equal(t, api.PhasePending, state.Status.Phase)
	assert.Equal(t, "op-1", state.Spec.ID)
	assert.True(t, t0.Equal(state.Spec.CreatedAt.Time))
	require.NotNil(t, state.Status.LaunchedAt, "the launch to the microsecond: the first runner's wait is measured from it")
	assert.True(t, t0.Equal(state.Status.LaunchedAt.Time))

	plan, err := f.ctl.Store().Plan(ctx)
	require.NoError(t, err)
	assert.JSONEq(t, `{"kind":"Plan"}`, string(plan))

	j, err := f.kube.BatchV1().Jobs("ichor-system").Get(ctx, "ichor-op-1-1", metav1.GetOptions{})
	require.NoError(t, err)
	assert.Equal(t, "img:v1", j.Spec.Template.Spec.Containers[0].Image)

	cr, err := f.kube.RbacV1().ClusterRoles().Get(ctx, "ichor-runner:ichor-system", metav1.GetOptions{})
	require.NoError(t, err)
	_, err = f.kube.RbacV1().RoleBindings("kube-system").Get(ctx, "ichor-runner:ichor-system", metav1.GetOptions{})
	require.NoError(t, err)
	role, err := f.kube.RbacV1().Roles("kube-system").Get(ctx, "ichor-runner:ichor-system", metav1.GetOptions{})
	require.NoError(t, err)
	assert.Equal(t, []string{
		"create daemonsets.apps kube-proxy", "create leases.coordination.k8s.io", "get daemonsets.apps kube-proxy",
		"get leases.coordination.k8s.io ichor-lock", "patch daemonsets.apps kube-proxy", "update leases.coordination.k8s.io ichor-lock", "watch leases.coordination.k8s.io ichor-lock",
	}, flatRules(role.Rules), "the manifests' kube-system objects and the cluster's one lock")
	assert.Equal(t, cr.Name, role.OwnerReferences[0].Name, "the ClusterRole owns the runner's other objects")
	_, err = f.kube.CoreV1().Namespaces().Get(ctx, "ichor-system", metav1.GetOptions{})
	require.NoError(t, err)

	sa, err := f.dyn.Resource(TalosAccountResource).Namespace("ichor-system").Get(ctx, TalosAccountName, metav1.GetOptions{})
	require.NoError(t, err)
	roles, _, _ := unstructured.NestedStringSlice(sa.Object, "spec", "roles")
	assert.Equal(t, []string{"os:admin"}, roles)

	// A second launch meets the first.
	_, err = f.ctl.Launch(ctx, launchRequest("op-2", api.CredentialsServiceAccount))

	var busy *BusyError
	require.ErrorAs(t, err, &busy)
	assert.Equal(t, "op-1", busy.Operation)
}

// TestLaunchWakesOnTheCredentials: Talos writes the Job's credentials a
// moment after the launch applies its ServiceAccount; the launch goes on at
// that write (a watch), not at its next poll, here an hour away.
func TestLaunchWakesOnTheCredentials(t *testing.T) {
	ctx := context.Background()
	f := newControl(t, t0)
	f.ctl.Poll, f.ctl.CredentialsTimeout = time.Hour, 5*time.Second

	written := make(chan error, 1)

	f.dyn.PrependReactor("patch", "serviceaccounts", func(k8stesting.Action) (bool, runtime.Object, error) {
		go func() {
			time.Sleep(50 * time.Millisecond) // Talos reconciles the account

			_, err := f.kube.CoreV1().Secrets("ichor-system").Create(context.Background(), talosSecret(), metav1.CreateOptions{})
			written <- err
		}()

		return false, nil, nil // the apply itself: the fixture's reactor
	})

	op, err := f.ctl.Launch(ctx, launchRequest("op-1", api.CredentialsServiceAccount))
	require.NoError(t, err)
	require.NoError(t, <-written)
	assert.Equal(t, "ichor-op-1-1", op.Status.Job)
}

// TestLaunchWatchesTheCredentialsOnce: while the launch waits for Talos' write,
// polling as it does, it keeps one watch open on the Secret, not one a poll.
func TestLaunchWatchesTheCredentialsOnce(t *testing.T) {
	ctx := context.Background()
	f := newControl(t, t0)
	f.ctl.Poll, f.ctl.CredentialsTimeout = 20*time.Millisecond, 5*time.Second

	written := make(chan error, 1)

	f.dyn.PrependReactor("patch", "serviceaccounts", func(k8stesting.Action) (bool, runtime.Object, error) {
		go func() {
			time.Sleep(300 * time.Millisecond) // a slow Talos: about 30 polls

			_, err := f.kube.CoreV1().Secrets("ichor-system").Create(context.Background(), talosSecret(), metav1.CreateOptions{})
			written <- err
		}()

		return false, nil, nil
	})

	_, err := f.ctl.Launch(ctx, launchRequest("op-1", api.CredentialsServiceAccount))
	require.NoError(t, err)
	require.NoError(t, <-written)

	gets, watches := 0, 0

	for _, a := range f.kube.Actions() {
		if a.GetResource().Resource != "secrets" {
			continue
		}

		switch a.GetVerb() {
		case "get":
			gets++
		case "watch":
			watches++
		}
	}

	assert.Greater(t, gets, 5, "the poll read the Secret")
	assert.Equal(t, 1, watches, "one watch for the whole wait")
}

func TestLaunchLocalCredentials(t *testing.T) {
	ctx := context.Background()
	f := newControl(t, t0)

	req := launchRequest("op-1", api.CredentialsLocal)
	req.Talosconfig = []byte("context: mine")

	_, err := f.ctl.Launch(ctx, req)
	require.NoError(t, err)

	s, err := f.kube.CoreV1().Secrets("ichor-system").Get(ctx, LocalTalosconfigName, metav1.GetOptions{})
	require.NoError(t, err)
	assert.Equal(t, "context: mine", string(s.Data[TalosconfigKey]))

	j, err := f.kube.BatchV1().Jobs("ichor-system").Get(ctx, "ichor-op-1-1", metav1.GetOptions{})
	require.NoError(t, err)
	assert.Equal(t, LocalTalosconfigName, j.Spec.Template.Spec.Volumes[0].Secret.SecretName)
}

func TestLaunchFailures(t *testing.T) {
	ctx := context.Background()

	t.Run("RBAC denied", func(t *testing.T) {
		f := newControl(t, t0, talosSecret())
		f.kube.PrependReactor("patch", "clusterroles", func(k8stesting.Action) (bool, runtime.Object, error) {
			return true, nil, apierrors.NewForbidden(schema.GroupResource{Group: "rbac.authorization.k8s.io", Resource: "clusterroles"}, RunnerName,
				errors.New(`User "bob" cannot patch resource "clusterroles" in API group "rbac.authorization.k8s.io" at the cluster scope`))
		})

		_, err := f.ctl.Launch(ctx, launchRequest("op-1", api.CredentialsServiceAccount))
		require.Error(t, err)
		assert.Contains(t, err.Error(), `apply ClusterRole ichor-runner:ichor-system: clusterroles.rbac.authorization.k8s.io "ichor-runner" is forbidden: User "bob" cannot patch`)
		assert.Contains(t, err.Error(), "RBAC denied")
		assert.Contains(t, err.Error(), "manifests/")

		state, err := f.ctl.Get(ctx)
		require.NoError(t, err)
		assert.Equal(t, api.PhaseAborted, state.Status.Phase, "a failed launch does not block the next")
		assert.Contains(t, state.Status.Reason, "launch failed: apply ClusterRole")
		require.NoError(t, f.ctl.CheckFree(ctx))
	})

	t.Run("Talos' API access is off", func(t *testing.T) {
		f := newControl(t, t0)

		// No talos.dev CRD: the server does not know the resource.
		f.dyn.PrependReactor("patch", "serviceaccounts", func(k8stesting.Action) (bool, runtime.Object, error) {
			return true, nil, apierrors.NewNotFound(schema.GroupResource{Group: "talos.dev", Resource: "serviceaccounts"}, "")
		})

		_, err := f.ctl.Launch(ctx, launchRequest("op-1", api.CredentialsServiceAccount))
		require.Error(t, err)
		assert.Equal(t, "the cluster does not serve talos.dev ServiceAccounts (Talos' Kubernetes API access is off): "+
			"enable machine.features.kubernetesTalosAPIAccess on the control planes with role os:admin and namespace ichor-system "+
			"(kubectl ichor plan shows the patch), or pass --talos-credentials=local", err.Error())
	})

	t.Run("Talos writes no credentials", func(t *testing.T) {
		f := newControl(t, t0)

		// Talos refused the ServiceAccount and said why.
		f.dyn.PrependReactor("get", "serviceaccounts", func(k8stesting.Action) (bool, runtime.Object, error) {
			sa := TalosAccount("ichor-system")
			require.NoError(t, unstructured.SetNestedField(sa.Object, `namespace "ichor-system" is not in allowedKubernetesNamespaces`, "status", "failureReason"))

			return true, sa, nil
		})

		_, err := f.ctl.Launch(ctx, launchRequest("op-1", api.CredentialsServiceAccount))
		require.Error(t, err)
		assert.Equal(t, "talos did not write the credentials of talos.dev ServiceAccount ichor-system/ichor-talos in 300ms "+
			`(Talos says: namespace "ichor-system" is not in allowedKubernetesNamespaces): enable machine.features.kubernetesTalosAPIAccess `+
			"on the control planes with role os:admin and namespace ichor-system (kubectl ichor plan shows the patch), or pass --talos-credentials=local", err.Error())
	})
}
