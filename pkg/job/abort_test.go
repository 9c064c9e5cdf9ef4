package job

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"

	api "github.com/ichor-dev/kubectl-ichor/pkg/api/v1alpha1"
	"github.com/ichor-dev/kubectl-ichor/pkg/discovery"
	"github.com/ichor-dev/kubectl-ichor/pkg/kube"
)

func TestAbort(t *testing.T) {
	ctx := context.Background()
	op := testOperation("op-1", api.PhaseRunning)
	op.Spec.Credentials = api.CredentialsLocal

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
		Operation: "op-1", Was: api.PhaseRunning, Jobs: []string{"ichor-op-1-1"}, Uncordoned: []string{"worker-1"}, Released: true,
		Removed: removedRunner,
	}, res)
	requireNoCredentials(t, f)

	state, err := f.ctl.Get(ctx)
	require.NoError(t, err)
	assert.Equal(t, api.PhaseAborted, state.Status.Phase, "the state stays, for the record")
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
	assert.Equal(t, api.PhaseAborted, res.Was)
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

	requireCredentialsGone(t, f)

	_, err := f.kube.CoreV1().ConfigMaps("ichor-system").Get(context.Background(), StateName, metav1.GetOptions{})
	assert.NoError(t, err, "the state stays")
}

// requireCredentialsGone checks that nothing of the runner's identity, permissions or
// Talos credentials is left.
func requireCredentialsGone(t *testing.T, f *controlFixture) {
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

	accounts, err := f.dyn.Resource(TalosAccountResource).Namespace("").List(ctx, metav1.ListOptions{})
	require.NoError(t, err)
	assert.Empty(t, accounts.Items, "the talos.dev ServiceAccount is deleted")
}

// TestAbortSucceeded: abort of a succeeded operation is how to clean up what its end left
// (credentials the runner could not delete, a node left cordoned); the phase stays.
func TestAbortSucceeded(t *testing.T) {
	ctx := context.Background()
	op := testOperation("op-1", api.PhaseSucceeded)
	op.Spec.Credentials = api.CredentialsLocal

	cordoned := &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: "worker-1", Annotations: map[string]string{kube.CordonedAnnotation: "2026-11-29T12:00:00Z"}},
		Spec:       corev1.NodeSpec{Unschedulable: true},
	}
	objs := []runtime.Object{stateObject(t, op), cordoned, LocalTalosconfig("ichor-system", "op-1", []byte("x"))}
	objs = append(objs, RunnerObjects("ichor-system", testAccess(), nil)...)

	f := newControl(t, t0, objs...)

	res, err := f.ctl.Abort(ctx)
	require.NoError(t, err)
	assert.Equal(t, &AbortResult{Operation: "op-1", Was: api.PhaseSucceeded, Uncordoned: []string{"worker-1"}, Removed: removedRunner}, res)
	requireNoCredentials(t, f)

	state, err := f.ctl.Get(ctx)
	require.NoError(t, err)
	assert.Equal(t, api.PhaseSucceeded, state.Status.Phase, "a succeeded operation stays Succeeded")

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

// ichorCordoned is a node ichor cordoned, held (ichor.dev/hold) when held.
func ichorCordoned(name string, held bool) *corev1.Node {
	n := &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: name, Annotations: map[string]string{kube.CordonedAnnotation: "2026-11-29T12:00:00Z"}},
		Spec:       corev1.NodeSpec{Unschedulable: true},
	}
	if held {
		n.Annotations[discovery.HoldAnnotation] = "disk"
	}

	return n
}

// requireCordon checks that node is cordoned by ichor (with its mark) or schedulable
// without the mark.
func requireCordon(t *testing.T, f *controlFixture, node string, cordoned bool) {
	t.Helper()

	n, err := f.kube.CoreV1().Nodes().Get(context.Background(), node, metav1.GetOptions{})
	require.NoError(t, err)
	assert.Equal(t, cordoned, n.Spec.Unschedulable, "%s unschedulable", node)
	assert.Equal(t, cordoned, kube.CordonedByIchor(n), "%s carries ichor's mark", node)
}

// TestAbortStateMissing: the state ConfigMap is gone (deleted by hand, pruned by a GitOps
// tool) while its runner is paused with a node cordoned and the os:admin credentials in
// place: abort finds what is left by its labels and cleans it up, saying so.
func TestAbortStateMissing(t *testing.T) {
	ctx := context.Background()
	failed := batchv1.JobCondition{Type: batchv1.JobFailed, Status: corev1.ConditionTrue, Reason: batchv1.JobReasonPodFailurePolicy}

	older := runnerJob("ichor-op-0-1")
	older.Labels[LabelOperation] = "op-0"
	older.CreationTimestamp = metav1.NewTime(t0.Add(-24 * time.Hour))

	paused := runnerJob("ichor-op-1-1", failed)
	paused.CreationTimestamp = metav1.NewTime(t0)

	objs := []runtime.Object{
		ichorCordoned("worker-1", false), ichorCordoned("worker-2", true),
		&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "worker-3"}, Spec: corev1.NodeSpec{Unschedulable: true}},
		older, paused, runnerPod("pod-a", "ichor-op-1-1", corev1.PodFailed), talosSecret(),
	}
	objs = append(objs, RunnerObjects("ichor-system", testAccess(), nil)...)

	f := newControl(t, t0.Add(time.Minute), objs...)
	_, err := f.dyn.Resource(TalosAccountResource).Namespace("ichor-system").Create(ctx, TalosAccount("ichor-system"), metav1.CreateOptions{})
	require.NoError(t, err)
	// op-0 ended before op-1 was launched: the launch put it in the history.
	require.NoError(t, f.ctl.Store().Archive(ctx, Record{Operation: testOperation("op-0", api.PhaseSucceeded)}))

	res, err := f.ctl.Abort(ctx)
	require.NoError(t, err)
	assert.Equal(t, &AbortResult{
		Operation: "op-1", StateMissing: true, Jobs: []string{"ichor-op-1-1"}, Uncordoned: []string{"worker-1"}, KeptHeld: []string{"worker-2"},
		Removed: append([]string{"serviceaccount.talos.dev ichor-system/ichor-talos", "secret ichor-system/ichor-talos"}, removedRunner[1:]...),
	}, res)
	requireCredentialsGone(t, f)

	requireCordon(t, f, "worker-1", false)
	requireCordon(t, f, "worker-2", true)

	n, err := f.kube.CoreV1().Nodes().Get(ctx, "worker-3", metav1.GetOptions{})
	require.NoError(t, err)
	assert.True(t, n.Spec.Unschedulable, "a node the operator cordoned stays cordoned")

	_, err = f.kube.BatchV1().Jobs("ichor-system").Get(ctx, "ichor-op-1-1", metav1.GetOptions{})
	assert.True(t, apierrors.IsNotFound(err), "the paused operation's Job is deleted")
	_, err = f.kube.BatchV1().Jobs("ichor-system").Get(ctx, "ichor-op-0-1", metav1.GetOptions{})
	assert.NoError(t, err, "an earlier operation's Job (its logs) stays")

	// Again: only the held node is left, said again, and the earlier Job stays; with
	// nothing at all, no operation.
	res, err = f.ctl.Abort(ctx)
	require.NoError(t, err)
	assert.Equal(t, &AbortResult{StateMissing: true, KeptHeld: []string{"worker-2"}}, res)
	_, err = f.kube.BatchV1().Jobs("ichor-system").Get(ctx, "ichor-op-0-1", metav1.GetOptions{})
	require.NoError(t, err)

	require.NoError(t, f.kube.CoreV1().Nodes().Delete(ctx, "worker-2", metav1.DeleteOptions{}))

	_, err = f.ctl.Abort(ctx)
	require.ErrorIs(t, err, ErrNoOperation)
	assert.Equal(t, "no operation in namespace ichor-system (no configmap ichor-state) and nothing of one is left: nothing to abort; "+
		"pass -n with the namespace it runs in", err.Error())
}

// TestAbortStateMissingAfterSuccess: the state of an operation that succeeded is gone
// (its last Job completed): its Jobs stay, a held node stays cordoned, the rest is
// cleaned up.
func TestAbortStateMissingAfterSuccess(t *testing.T) {
	done := runnerJob("ichor-op-1-1", batchv1.JobCondition{Type: batchv1.JobComplete, Status: corev1.ConditionTrue})
	f := newControl(t, t0, done, ichorCordoned("worker-1", false), ichorCordoned("worker-2", true), talosSecret())

	res, err := f.ctl.Abort(context.Background())
	require.NoError(t, err)
	assert.Equal(t, &AbortResult{
		Operation: "op-1", Was: api.PhaseSucceeded, StateMissing: true, Uncordoned: []string{"worker-1"}, KeptHeld: []string{"worker-2"},
		Removed: []string{"secret ichor-system/ichor-talos"},
	}, res)
	requireCordon(t, f, "worker-2", true)

	_, err = f.kube.BatchV1().Jobs("ichor-system").Get(context.Background(), "ichor-op-1-1", metav1.GetOptions{})
	assert.NoError(t, err, "a succeeded operation's Job stays for the record")
}

// TestAbortStateMissingRefusesWhileAnotherNamespaceRuns: without a state, the nodes ichor
// cordoned may be an operation's of another namespace: abort uncordons nothing and names it.
func TestAbortStateMissingRefusesWhileAnotherNamespaceRuns(t *testing.T) {
	elsewhere, err := EncodeState("upgrades", testOperation("op-9", api.PhasePaused), nil)
	require.NoError(t, err)

	f := newControl(t, t0.Add(time.Minute), elsewhere, ichorCordoned("worker-1", false), talosSecret())

	_, err = f.ctl.Abort(context.Background())
	require.Error(t, err)
	assert.Equal(t, "no operation in namespace ichor-system (no configmap ichor-state), and operation op-9 in namespace upgrades "+
		"(Paused, launched 1m0s ago) is paused: continue it with kubectl ichor resume -n upgrades, or stop it with kubectl ichor abort -n upgrades; "+
		"nothing was stopped or uncordoned", err.Error())
	requireCordon(t, f, "worker-1", true)

	_, err = f.kube.CoreV1().Secrets("ichor-system").Get(context.Background(), TalosAccountName, metav1.GetOptions{})
	assert.NoError(t, err)
}

// TestAbortHeldNodes: a held node ichor cordoned stays cordoned after an upgrade that
// succeeded (it left it so on purpose) and is named; an operation not finished is aborted
// with every node ichor cordoned uncordoned, held ones included.
func TestAbortHeldNodes(t *testing.T) {
	for _, tc := range []struct {
		phase    api.Phase
		uncordon []string
		kept     []string
	}{
		{api.PhaseSucceeded, []string{"worker-1"}, []string{"worker-2"}},
		{api.PhasePaused, []string{"worker-1", "worker-2"}, nil},
	} {
		t.Run(string(tc.phase), func(t *testing.T) {
			schedulable := ichorCordoned("worker-3", true)
			schedulable.Spec.Unschedulable = false // held, marked, then kubectl uncordon

			f := newControl(t, t0, stateObject(t, testOperation("op-1", tc.phase)), ichorCordoned("worker-1", false), ichorCordoned("worker-2", true), schedulable)

			res, err := f.ctl.Abort(context.Background())
			require.NoError(t, err)
			assert.Equal(t, tc.phase, res.Was)

			if tc.phase == api.PhasePaused {
				tc.uncordon = append(tc.uncordon, "worker-3")
			}

			assert.Equal(t, tc.uncordon, res.Uncordoned)
			assert.Equal(t, tc.kept, res.KeptHeld)
			requireCordon(t, f, "worker-1", false)
			requireCordon(t, f, "worker-2", tc.phase == api.PhaseSucceeded)
		})
	}
}
