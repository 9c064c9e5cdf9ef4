package job

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/ichor-dev/kubectl-ichor/pkg/kube"
)

func TestAbort(t *testing.T) {
	ctx := context.Background()
	op := testOperation("op-1", PhaseRunning)
	op.Spec.Credentials = CredentialsLocal

	cordoned := &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: "worker-1", Annotations: map[string]string{kube.CordonedAnnotation: "2026-11-29T12:00:00Z"}},
		Spec:       corev1.NodeSpec{Unschedulable: true},
	}
	byHand := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "worker-2"}, Spec: corev1.NodeSpec{Unschedulable: true}}

	objs := []runtime.Object{stateObject(t, op), cordoned, byHand,
		runnerJob(op.Status.Job), runnerPod("pod-a", op.Status.Job, corev1.PodRunning), heldLease("ichor-system/pod-a", t0.Add(50*time.Second)),
		LocalTalosconfig("ichor-system", "op-1", []byte("x"))}
	objs = append(objs, RunnerObjects("ichor-system", testAccess(), nil)...)

	f := newControl(t, t0.Add(time.Minute), objs...)

	res, err := f.ctl.Abort(ctx)
	require.NoError(t, err)
	assert.Equal(t, &AbortResult{
		Operation: "op-1", Was: PhaseRunning, Jobs: []string{"ichor-op-1-1"}, Uncordoned: []string{"worker-1"}, Released: true,
		Removed: removedRunner,
	}, res)
	requireNoCredentials(t, f)

	state, err := f.ctl.Get(ctx)
	require.NoError(t, err)
	assert.Equal(t, PhaseAborted, state.Status.Phase, "the state stays, for the record")
	assert.NotNil(t, state.Status.FinishedAt)

	n, err := f.kube.CoreV1().Nodes().Get(ctx, "worker-1", metav1.GetOptions{})
	require.NoError(t, err)
	assert.False(t, n.Spec.Unschedulable)
	assert.NotContains(t, n.Annotations, kube.CordonedAnnotation)

	n, err = f.kube.CoreV1().Nodes().Get(ctx, "worker-2", metav1.GetOptions{})
	require.NoError(t, err)
	assert.True(t, n.Spec.Unschedulable, "a node the operator cordoned stays cordoned")

	_, err = f.kube.BatchV1().Jobs("ichor-system").Get(ctx, op.Status.Job, metav1.GetOptions{})
	assert.True(t, apierrors.IsNotFound(err))

	_, err = f.kube.CoreV1().Secrets("ichor-system").Get(ctx, LocalTalosconfigName, metav1.GetOptions{})
	assert.True(t, apierrors.IsNotFound(err), "the copied talosconfig is deleted")

	l, err := f.kube.CoordinationV1().Leases(LockNamespace).Get(ctx, LockName, metav1.GetOptions{})
	require.NoError(t, err)
	assert.Empty(t, *l.Spec.HolderIdentity)

	// Again: nothing left to do, still fine.
	res, err = f.ctl.Abort(ctx)
	require.NoError(t, err)
	assert.Equal(t, PhaseAborted, res.Was)
	assert.Empty(t, res.Uncordoned)
}

func TestAbortCorruptState(t *testing.T) {
	ctx := context.Background()
	corrupt := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: StateName, Namespace: "ichor-system"}, BinaryData: map[string][]byte{OperationKey: []byte("{")}}

	f := newControl(t, t0, corrupt, runnerJob("ichor-op-1-1"))

	res, err := f.ctl.Abort(ctx)
	require.NoError(t, err)
	assert.Equal(t, []string{"ichor-op-1-1"}, res.Jobs)

	var c *CorruptStateError
	assert.ErrorAs(t, res.StateErr, &c)
}

// removedRunner is what RemoveCredentials deletes of a runner launched with
// --talos-credentials=local and testAccess.
var removedRunner = []string{
	"secret ichor-system/ichor-talosconfig",
	"rolebinding ichor-system/ichor-runner",
	"rolebinding kube-system/ichor-runner:ichor-system",
	"role ichor-system/ichor-runner",
	"role kube-system/ichor-runner:ichor-system",
	"clusterrolebinding ichor-runner:ichor-system",
	"clusterrole ichor-runner:ichor-system",
	"serviceaccount ichor-system/ichor-runner",
}

// requireNoCredentials checks that nothing of the runner's identity, permissions or Talos
// credentials is left; the state stays.
func requireNoCredentials(t *testing.T, f *controlFixture) {
	t.Helper()

	ctx := context.Background()
	rbac := f.kube.RbacV1()

	crs, err := rbac.ClusterRoles().List(ctx, metav1.ListOptions{})
	require.NoError(t, err)
	assert.Empty(t, crs.Items)

	crbs, err := rbac.ClusterRoleBindings().List(ctx, metav1.ListOptions{})
	require.NoError(t, err)
	assert.Empty(t, crbs.Items)

	roles, err := rbac.Roles("").List(ctx, metav1.ListOptions{})
	require.NoError(t, err)
	assert.Empty(t, roles.Items)

	rbs, err := rbac.RoleBindings("").List(ctx, metav1.ListOptions{})
	require.NoError(t, err)
	assert.Empty(t, rbs.Items)

	sas, err := f.kube.CoreV1().ServiceAccounts("").List(ctx, metav1.ListOptions{})
	require.NoError(t, err)
	assert.Empty(t, sas.Items)

	secrets, err := f.kube.CoreV1().Secrets("").List(ctx, metav1.ListOptions{})
	require.NoError(t, err)
	assert.Empty(t, secrets.Items)

	_, err = f.kube.CoreV1().ConfigMaps("ichor-system").Get(ctx, StateName, metav1.GetOptions{})
	assert.NoError(t, err, "the state stays")
}

// TestAbortSucceeded: abort of a succeeded operation is how to clean up what its end left
// (credentials the runner could not delete, a node left cordoned); the phase stays.
func TestAbortSucceeded(t *testing.T) {
	ctx := context.Background()
	op := testOperation("op-1", PhaseSucceeded)
	op.Spec.Credentials = CredentialsLocal

	cordoned := &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: "worker-1", Annotations: map[string]string{kube.CordonedAnnotation: "2026-11-29T12:00:00Z"}},
		Spec:       corev1.NodeSpec{Unschedulable: true},
	}
	objs := []runtime.Object{stateObject(t, op), cordoned, LocalTalosconfig("ichor-system", "op-1", []byte("x"))}
	objs = append(objs, RunnerObjects("ichor-system", testAccess(), nil)...)

	f := newControl(t, t0, objs...)

	res, err := f.ctl.Abort(ctx)
	require.NoError(t, err)
	assert.Equal(t, &AbortResult{Operation: "op-1", Was: PhaseSucceeded, Uncordoned: []string{"worker-1"}, Removed: removedRunner}, res)
	requireNoCredentials(t, f)

	state, err := f.ctl.Get(ctx)
	require.NoError(t, err)
	assert.Equal(t, PhaseSucceeded, state.Status.Phase, "a succeeded operation stays Succeeded")

	// Again: nothing left.
	res, err = f.ctl.Abort(ctx)
	require.NoError(t, err)
	assert.Empty(t, res.Removed)
	assert.Empty(t, res.Uncordoned)
}

func TestAbortRefusals(t *testing.T) {
	f := newControl(t, t0)
	_, err := f.ctl.Abort(context.Background())
	assert.ErrorIs(t, err, ErrNoOperation)
}
