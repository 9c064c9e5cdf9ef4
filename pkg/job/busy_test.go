package job

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	k8stesting "k8s.io/client-go/testing"

	api "github.com/ichor-dev/kubectl-ichor/pkg/api/v1alpha1"
)

func TestBusy(t *testing.T) {
	now := t0.Add(5 * time.Minute)
	running := testOperation("op-1", api.PhaseRunning)
	running.Status.UpdatedAt = ptrTime(t0)

	paused := testOperation("op-1", api.PhasePaused)
	paused.Status.Reason = "worker-1: node NotReady after 20m0s"
	paused.Status.UpdatedAt = ptrTime(t0)

	pending := testOperation("op-1", api.PhasePending)
	pending.Status.UpdatedAt = ptrTime(now.Add(-10 * time.Second))

	tests := []struct {
		name string
		op   *api.Operation
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
		{name: "succeeded", op: testOperation("op-1", api.PhaseSucceeded)},
		{name: "aborted", op: testOperation("op-1", api.PhaseAborted)},
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
	err := &BusyError{Namespace: "upgrades", Operation: "op-1", Phase: api.PhasePaused, Age: time.Hour}
	assert.Equal(t, "operation op-1 (Paused, launched 1h0m0s ago) is paused: continue it with kubectl ichor resume -n upgrades, "+
		"or stop it with kubectl ichor abort -n upgrades", err.Error())
}

func TestCheckFreeLooksAtOtherNamespaces(t *testing.T) {
	now := t0.Add(time.Minute)
	elsewhere, err := EncodeState("upgrades", testOperation("op-9", api.PhasePaused), nil)
	require.NoError(t, err)

	f := newControl(t, now, elsewhere)

	err = f.ctl.CheckFree(context.Background())

	var busy *BusyError
	require.ErrorAs(t, err, &busy)
	assert.Equal(t, "operation op-9 in namespace upgrades (Paused, launched 1m0s ago) is paused: continue it with kubectl ichor resume -n upgrades, "+
		"or stop it with kubectl ichor abort -n upgrades", err.Error())

	done, err := EncodeState("upgrades", testOperation("op-9", api.PhaseSucceeded), nil)
	require.NoError(t, err)
	require.NoError(t, newControl(t, now, done).ctl.CheckFree(context.Background()))
}

// The lock is the cluster's, in kube-system: a runner of another namespace that holds it
// refuses a new operation here, naming it, even when the operations of other namespaces
// cannot be read.
func TestCheckFreeRefusesWhileAnotherNamespaceHoldsTheLock(t *testing.T) {
	now := t0.Add(5 * time.Minute)
	other := testOperation("op-9", api.PhaseRunning)

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
	mine := testOperation("op-1", api.PhasePaused)
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

// TestWaitJobEndedByItsPods: the Job's runner pods tell its end before the Job
// controller's Complete: a pod that succeeded and none left running. A Job whose pods
// all failed may run another (a crashed runner), and one with a pod still running has
// not ended.
func TestWaitJobEndedByItsPods(t *testing.T) {
	pod := func(name string, phase corev1.PodPhase) *corev1.Pod {
		return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "ichor-system", Labels: map[string]string{"job-name": "ichor-op-1"}},
			Status: corev1.PodStatus{Phase: phase}}
	}
	running := &batchv1.Job{ObjectMeta: metav1.ObjectMeta{Name: "ichor-op-1", Namespace: "ichor-system"}}

	tests := []struct {
		name  string
		pods  []runtime.Object
		ended bool
	}{
		{"succeeded after a hand-over", []runtime.Object{pod("a", corev1.PodFailed), pod("b", corev1.PodSucceeded)}, true},
		{"succeeded, another pod still running", []runtime.Object{pod("a", corev1.PodSucceeded), pod("b", corev1.PodRunning)}, false},
		{"every pod failed", []runtime.Object{pod("a", corev1.PodFailed)}, false},
		{"the runner still running", []runtime.Object{pod("a", corev1.PodRunning)}, false},
	}

	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newControl(t, time.Now(), append(tt.pods, running)...)

			ended, err := f.ctl.WaitJobEnded(t.Context(), "ichor-op-1", 200*time.Millisecond)
			require.NoError(t, err)
			assert.Equal(t, tt.ended, ended)
		})
	}
}
