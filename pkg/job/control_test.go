package job

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	batchv1 "k8s.io/api/batch/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	dynamicfake "k8s.io/client-go/dynamic/fake"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/ichor-dev/kubectl-ichor/pkg/engine"
)

type controlFixture struct {
	kube *fake.Clientset
	dyn  *dynamicfake.FakeDynamicClient
	ctl  *Control
}

func newControl(t *testing.T, now time.Time, objs ...runtime.Object) *controlFixture {
	t.Helper()

	scheme := runtime.NewScheme()
	f := &controlFixture{
		kube: fake.NewClientset(objs...),
		dyn:  dynamicfake.NewSimpleDynamicClientWithCustomListKinds(scheme, map[schema.GroupVersionResource]string{TalosAccountResource: "ServiceAccountList"}),
	}
	withResourceVersions(f.kube, leasesResource, configmapsResource)

	// The dynamic fake's apply does not create: do what the apiserver does.
	f.dyn.PrependReactor("patch", "serviceaccounts", func(a k8stesting.Action) (bool, runtime.Object, error) {
		p := a.(k8stesting.PatchAction)
		u := &unstructured.Unstructured{}

		if err := u.UnmarshalJSON(p.GetPatch()); err != nil {
			return true, nil, err
		}

		if _, err := f.dyn.Tracker().Get(TalosAccountResource, p.GetNamespace(), p.GetName()); apierrors.IsNotFound(err) {
			return true, u, f.dyn.Tracker().Create(TalosAccountResource, u, p.GetNamespace())
		}

		return true, u, f.dyn.Tracker().Update(TalosAccountResource, u, p.GetNamespace())
	})

	f.ctl = &Control{
		Kube: f.kube, Dynamic: f.dyn, Namespace: "ichor-system",
		CredentialsTimeout: 300 * time.Millisecond, StopTimeout: 2 * time.Second, Poll: 20 * time.Millisecond,
		Now: func() time.Time { return now },
	}

	return f
}

func heldLease(holder string, renewed time.Time) *coordinationv1.Lease {
	duration := int32(15)
	r := metav1.NewMicroTime(renewed)

	return &coordinationv1.Lease{
		ObjectMeta: metav1.ObjectMeta{Name: LockName, Namespace: LockNamespace},
		Spec:       coordinationv1.LeaseSpec{HolderIdentity: &holder, RenewTime: &r, AcquireTime: &r, LeaseDurationSeconds: &duration},
	}
}

func runnerPod(name, job string, phase corev1.PodPhase) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			Name: name, Namespace: "ichor-system", CreationTimestamp: metav1.NewTime(t0),
			Labels: map[string]string{"job-name": job, LabelOperation: "op-1", LabelManagedBy: AppName},
		},
		Status: corev1.PodStatus{Phase: phase},
	}
}

func runnerJob(name string, conditions ...batchv1.JobCondition) *batchv1.Job {
	return &batchv1.Job{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "ichor-system", Labels: map[string]string{LabelOperation: "op-1", LabelManagedBy: AppName}},
		Status:     batchv1.JobStatus{Conditions: conditions},
	}
}

func TestBusy(t *testing.T) {
	now := t0.Add(5 * time.Minute)
	running := testOperation("op-1", PhaseRunning)
	running.Status.UpdatedAt = ptrTime(t0)

	paused := testOperation("op-1", PhasePaused)
	paused.Status.Reason = "worker-1: node NotReady after 20m0s"
	paused.Status.UpdatedAt = ptrTime(t0)

	pending := testOperation("op-1", PhasePending)
	pending.Status.UpdatedAt = ptrTime(now.Add(-10 * time.Second))

	tests := []struct {
		name string
		op   *Operation
		objs []runtime.Object
		want string // "" means free
	}{
		{
			name: "a live holder", op: running,
			objs: []runtime.Object{heldLease("ichor-system/pod-a", now.Add(-3*time.Second)), runnerPod("pod-a", running.Status.Job, corev1.PodRunning)},
			want: "operation op-1 (Running, launched 5m0s ago) holds the lock lease kube-system/ichor-lock (holder: pod ichor-system/pod-a): " +
				"one operation per cluster; follow it with kubectl ichor status --watch, or stop it with kubectl ichor abort",
		},
		{
			name: "paused", op: paused,
			want: "operation op-1 (Paused, launched 5m0s ago) is paused: worker-1: node NotReady after 20m0s: " +
				"continue it with kubectl ichor resume, or stop it with kubectl ichor abort",
		},
		{
			name: "its Job is still active", op: running,
			objs: []runtime.Object{runnerJob(running.Status.Job)},
			want: "operation op-1 (Running, launched 5m0s ago) is starting in job ichor-system/ichor-op-1-1",
		},
		{
			name: "being launched", op: pending,
			want: "operation op-1 (Pending, launched 5m0s ago) is being launched",
		},
		{
			name: "the holder is gone and its Job failed", op: running,
			objs: []runtime.Object{
				heldLease("ichor-system/pod-a", now.Add(-3*time.Second)), runnerPod("pod-a", running.Status.Job, corev1.PodFailed),
				runnerJob(running.Status.Job, batchv1.JobCondition{Type: batchv1.JobFailed, Status: corev1.ConditionTrue}),
			},
		},
		{
			name: "the lock expired and the Job is gone", op: running,
			objs: []runtime.Object{heldLease("ichor-system/pod-a", now.Add(-time.Minute)), runnerPod("pod-a", running.Status.Job, corev1.PodRunning)},
		},
		{name: "succeeded", op: testOperation("op-1", PhaseSucceeded)},
		{name: "aborted", op: testOperation("op-1", PhaseAborted)},
	}

	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newControl(t, now, append(tt.objs, stateObject(t, tt.op))...)

			err := f.ctl.CheckFree(context.Background())
			if tt.want == "" {
				assert.NoError(t, err)

				return
			}

			var busy *BusyError
			require.ErrorAs(t, err, &busy)
			assert.Contains(t, err.Error(), tt.want)
		})
	}
}

func TestBusyNamesTheNamespace(t *testing.T) {
	err := &BusyError{Namespace: "upgrades", Operation: "op-1", Phase: PhasePaused, Age: time.Hour}
	assert.Equal(t, "operation op-1 (Paused, launched 1h0m0s ago) is paused: continue it with kubectl ichor resume -n upgrades, "+
		"or stop it with kubectl ichor abort -n upgrades", err.Error())
}

func launchRequest(id string, creds Credentials) LaunchRequest {
	return LaunchRequest{
		Spec: OperationSpec{ID: id, Upgrade: engine.KindKubernetes, Target: "v1.36.3", MaxUnavailable: 1, Image: "img:v1", Credentials: creds},
		Plan: []byte(`{"kind":"Plan"}`),
	}
}

func talosSecret() *corev1.Secret {
	return &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: TalosAccountName, Namespace: "ichor-system"},
		Data:       map[string][]byte{TalosconfigKey: []byte("context: x")},
	}
}

func TestLaunch(t *testing.T) {
	ctx := context.Background()
	f := newControl(t, t0, talosSecret())
	access := testAccess()
	f.ctl.Access = &access

	op, err := f.ctl.Launch(ctx, launchRequest("op-1", CredentialsServiceAccount))
	require.NoError(t, err)
	assert.Equal(t, "ichor-op-1-1", op.Status.Job)

	state, err := f.ctl.Get(ctx)
	require.NoError(t, err)
	assert.Equal(t, PhasePending, state.Status.Phase)
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
		"get leases.coordination.k8s.io ichor-lock", "patch daemonsets.apps kube-proxy", "update leases.coordination.k8s.io ichor-lock",
	}, flatRules(role.Rules), "the manifests' kube-system objects and the cluster's one lock")
	assert.Equal(t, cr.Name, role.OwnerReferences[0].Name, "the ClusterRole owns the runner's other objects")
	_, err = f.kube.CoreV1().Namespaces().Get(ctx, "ichor-system", metav1.GetOptions{})
	require.NoError(t, err)

	sa, err := f.dyn.Resource(TalosAccountResource).Namespace("ichor-system").Get(ctx, TalosAccountName, metav1.GetOptions{})
	require.NoError(t, err)
	roles, _, _ := unstructured.NestedStringSlice(sa.Object, "spec", "roles")
	assert.Equal(t, []string{"os:admin"}, roles)

	// A second launch meets the first.
	_, err = f.ctl.Launch(ctx, launchRequest("op-2", CredentialsServiceAccount))

	var busy *BusyError
	require.ErrorAs(t, err, &busy)
	assert.Equal(t, "op-1", busy.Operation)
}

func TestLaunchLocalCredentials(t *testing.T) {
	ctx := context.Background()
	f := newControl(t, t0)

	req := launchRequest("op-1", CredentialsLocal)
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

		_, err := f.ctl.Launch(ctx, launchRequest("op-1", CredentialsServiceAccount))
		require.Error(t, err)
		assert.Contains(t, err.Error(), `apply ClusterRole ichor-runner:ichor-system: clusterroles.rbac.authorization.k8s.io "ichor-runner" is forbidden: User "bob" cannot patch`)
		assert.Contains(t, err.Error(), "RBAC denied")
		assert.Contains(t, err.Error(), "manifests/")

		state, err := f.ctl.Get(ctx)
		require.NoError(t, err)
		assert.Equal(t, PhaseAborted, state.Status.Phase, "a failed launch does not block the next")
		assert.Contains(t, state.Status.Reason, "launch failed: apply ClusterRole")
		require.NoError(t, f.ctl.CheckFree(ctx))
	})

	t.Run("Talos' API access is off", func(t *testing.T) {
		f := newControl(t, t0)

		// No talos.dev CRD: the server does not know the resource.
		f.dyn.PrependReactor("patch", "serviceaccounts", func(k8stesting.Action) (bool, runtime.Object, error) {
			return true, nil, apierrors.NewNotFound(schema.GroupResource{Group: "talos.dev", Resource: "serviceaccounts"}, "")
		})

		_, err := f.ctl.Launch(ctx, launchRequest("op-1", CredentialsServiceAccount))
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

		_, err := f.ctl.Launch(ctx, launchRequest("op-1", CredentialsServiceAccount))
		require.Error(t, err)
		assert.Equal(t, "talos did not write the credentials of talos.dev ServiceAccount ichor-system/ichor-talos in 300ms "+
			`(Talos says: namespace "ichor-system" is not in allowedKubernetesNamespaces): enable machine.features.kubernetesTalosAPIAccess `+
			"on the control planes with role os:admin and namespace ichor-system (kubectl ichor plan shows the patch), or pass --talos-credentials=local", err.Error())
	})
}

// testAccess gives the runner rules in kube-system, so that it has a Role there.
func testAccess() ManifestAccess {
	return ManifestAccess{Namespaced: map[string][]rbacv1.PolicyRule{
		"kube-system": {{APIGroups: []string{"apps"}, Resources: []string{"daemonsets"}, Verbs: ManifestVerbs(), ResourceNames: []string{"kube-proxy"}}},
	}}
}

func TestResume(t *testing.T) {
	ctx := context.Background()

	t.Run("paused", func(t *testing.T) {
		op := testOperation("op-1", PhasePaused)
		op.Status.Reason, op.Status.Action, op.Status.PausedNode = "r", "a", "worker-1"

		failed := runnerJob(op.Status.Job, batchv1.JobCondition{Type: batchv1.JobFailed, Status: corev1.ConditionTrue})
		f := newControl(t, t0, stateObject(t, op), failed, talosSecret())

		got, err := f.ctl.Resume(ctx, nil)
		require.NoError(t, err)
		assert.Equal(t, 2, got.Status.Attempt)
		assert.Equal(t, "ichor-op-1-2", got.Status.Job)

		state, err := f.ctl.Get(ctx)
		require.NoError(t, err)
		assert.Equal(t, PhasePending, state.Status.Phase)
		assert.Empty(t, state.Status.Reason)
		assert.Empty(t, state.Status.PausedNode)

		_, err = f.kube.BatchV1().Jobs("ichor-system").Get(ctx, "ichor-op-1-1", metav1.GetOptions{})
		assert.True(t, apierrors.IsNotFound(err), "the old Job is deleted")
		_, err = f.kube.BatchV1().Jobs("ichor-system").Get(ctx, "ichor-op-1-2", metav1.GetOptions{})
		assert.NoError(t, err)
	})

	t.Run("running, its runner gone", func(t *testing.T) {
		op := testOperation("op-1", PhaseRunning)
		f := newControl(t, t0, stateObject(t, op), runnerJob(op.Status.Job), runnerPod("pod-a", op.Status.Job, corev1.PodFailed), talosSecret())

		got, err := f.ctl.Resume(ctx, nil)
		require.NoError(t, err)
		assert.Equal(t, "ichor-op-1-2", got.Status.Job)
	})

	tests := []struct {
		name string
		op   *Operation
		objs []runtime.Object
		want string
	}{
		{
			name: "a live runner", op: testOperation("op-1", PhaseRunning),
			objs: []runtime.Object{heldLease("ichor-system/pod-a", t0), runnerPod("pod-a", "ichor-op-1-1", corev1.PodRunning)},
			want: "operation op-1 is running (pod ichor-system/pod-a holds the lock): nothing to resume; follow it with kubectl ichor status --watch",
		},
		{
			name: "a pod still starting", op: testOperation("op-1", PhasePending),
			objs: []runtime.Object{runnerPod("pod-b", "ichor-op-1-1", corev1.PodPending)},
			want: "operation op-1 is pending in pod pod-b: nothing to resume",
		},
		{name: "succeeded", op: testOperation("op-1", PhaseSucceeded), want: "operation op-1 succeeded: nothing to resume"},
		{name: "aborted", op: testOperation("op-1", PhaseAborted), want: "operation op-1 was aborted: start a new one with kubectl ichor upgrade"},
	}

	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newControl(t, t0, append(tt.objs, stateObject(t, tt.op))...)
			_, err := f.ctl.Resume(ctx, nil)
			require.Error(t, err)
			assert.Contains(t, err.Error(), tt.want)
		})
	}
}

func TestDiagnose(t *testing.T) {
	op := testOperation("op-1", PhaseRunning)
	op.Status.UpdatedAt = ptrTime(t0)

	waiting := runnerPod("pod-a", op.Status.Job, corev1.PodPending)
	waiting.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: ContainerName, State: corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{
		Reason: "ImagePullBackOff", Message: `Back-off pulling image "img:v1"`,
	}}}}

	failedPod := runnerPod("pod-b", op.Status.Job, corev1.PodFailed)
	failedPod.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: ContainerName, State: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: 1}}}}

	evicted := runnerPod("pod-c", op.Status.Job, corev1.PodFailed)
	evicted.Status.Conditions = []corev1.PodCondition{{Type: corev1.DisruptionTarget, Status: corev1.ConditionTrue}}

	tests := []struct {
		name  string
		objs  []runtime.Object
		want  string
		final bool
	}{
		{name: "nothing wrong", objs: []runtime.Object{runnerJob(op.Status.Job), runnerPod("pod-a", op.Status.Job, corev1.PodRunning)}},
		{
			name: "job failed", final: true,
			objs: []runtime.Object{runnerJob(op.Status.Job, batchv1.JobCondition{Type: batchv1.JobFailed, Status: corev1.ConditionTrue, Reason: "BackoffLimitExceeded", Message: "Job has reached the specified backoff limit"})},
			want: "job ichor-system/ichor-op-1-1 failed (BackoffLimitExceeded: Job has reached the specified backoff limit): read kubectl ichor logs, then continue with kubectl ichor resume",
		},
		{name: "job gone", final: true, want: "job ichor-system/ichor-op-1-1 is gone while operation op-1 is Running: continue it with kubectl ichor resume"},
		{
			name: "image", objs: []runtime.Object{runnerJob(op.Status.Job), waiting},
			want: `pod pod-a cannot start: ImagePullBackOff: Back-off pulling image "img:v1" (is --image ghcr.io/ichor-dev/kubectl-ichor:v0.1.0 right?)`,
		},
		{
			name: "a crash", objs: []runtime.Object{runnerJob(op.Status.Job), failedPod},
			want: "runner pod pod-b failed (exit code 1); the Job tries again (0 failures of 6 allowed): read kubectl ichor logs",
		},
		{name: "an eviction is no failure", objs: []runtime.Object{runnerJob(op.Status.Job), evicted}},
	}

	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newControl(t, t0.Add(time.Hour), tt.objs...)

			p, err := f.ctl.Diagnose(context.Background(), op)
			require.NoError(t, err)

			if tt.want == "" {
				assert.Nil(t, p)

				return
			}

			require.NotNil(t, p)
			assert.Equal(t, tt.want, p.Message)
			assert.Equal(t, tt.final, p.Final)
		})
	}
}

func TestCheckFreeLooksAtOtherNamespaces(t *testing.T) {
	now := t0.Add(time.Minute)
	elsewhere, err := EncodeState("upgrades", testOperation("op-9", PhasePaused), nil)
	require.NoError(t, err)

	f := newControl(t, now, elsewhere)

	err = f.ctl.CheckFree(context.Background())

	var busy *BusyError
	require.ErrorAs(t, err, &busy)
	assert.Equal(t, "operation op-9 in namespace upgrades (Paused, launched 1m0s ago) is paused: continue it with kubectl ichor resume -n upgrades, "+
		"or stop it with kubectl ichor abort -n upgrades", err.Error())

	done, err := EncodeState("upgrades", testOperation("op-9", PhaseSucceeded), nil)
	require.NoError(t, err)
	require.NoError(t, newControl(t, now, done).ctl.CheckFree(context.Background()))
}

// The lock is the cluster's, in kube-system: a runner of another namespace that holds it
// refuses a new operation here, naming it, even when the operations of other namespaces
// cannot be read.
func TestCheckFreeRefusesWhileAnotherNamespaceHoldsTheLock(t *testing.T) {
	now := t0.Add(5 * time.Minute)
	other := testOperation("op-9", PhaseRunning)

	elsewhere, err := EncodeState("upgrades", other, nil)
	require.NoError(t, err)

	holderPod := runnerPod("pod-b", other.Status.Job, corev1.PodRunning)
	holderPod.Namespace = "upgrades"

	f := newControl(t, now, heldLease("upgrades/pod-b", now.Add(-3*time.Second)), holderPod, elsewhere)

	err = f.ctl.CheckFree(context.Background())

	var busy *BusyError
	require.ErrorAs(t, err, &busy)
	assert.Equal(t, "operation op-9 in namespace upgrades (Running, launched 5m0s ago) holds the lock lease kube-system/ichor-lock "+
		"(holder: pod upgrades/pod-b): one operation per cluster; follow it with kubectl ichor status --watch -n upgrades, "+
		"or stop it with kubectl ichor abort -n upgrades", err.Error())

	// Its own operation's Busy is not this namespace's: abort here neither waits for nor
	// releases it.
	mine := testOperation("op-1", PhasePaused)
	g := newControl(t, now, heldLease("upgrades/pod-b", now.Add(-3*time.Second)), holderPod, stateObject(t, mine))
	g.ctl.StopTimeout = 200 * time.Millisecond

	res, err := g.ctl.Abort(context.Background())
	require.NoError(t, err)
	assert.False(t, res.Released)

	l, err := g.kube.CoordinationV1().Leases(LockNamespace).Get(context.Background(), LockName, metav1.GetOptions{})
	require.NoError(t, err)
	assert.Equal(t, "upgrades/pod-b", *l.Spec.HolderIdentity)
}

// An error listing the operations of other namespaces is no proof that none runs.
func TestCheckFreeFailsWhenTheOperationsCannotBeListed(t *testing.T) {
	f := newControl(t, t0)
	f.kube.PrependReactor("list", "configmaps", func(k8stesting.Action) (bool, runtime.Object, error) {
		return true, nil, apierrors.NewForbidden(schema.GroupResource{Resource: "configmaps"}, "", errors.New("no"))
	})

	err := f.ctl.CheckFree(context.Background())
	require.Error(t, err)

	var busy *BusyError
	assert.False(t, errors.As(err, &busy))
	assert.Contains(t, err.Error(), "list the operations of every namespace (configmaps named ichor-state): ")
	assert.Contains(t, err.Error(), "run it with credentials that may list configmaps in all namespaces")
}
