package job

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"

	api "github.com/ichor-dev/kubectl-ichor/pkg/api/v1alpha1"
)

func TestResume(t *testing.T) {
	ctx := context.Background()

	t.Run("paused", func(t *testing.T) {
		op := testOperation("op-1", api.PhasePaused)
		op.Status.Reason, op.Status.Action, op.Status.PausedNode = "r", "a", "worker-1"

		failed := runnerJob(op.Status.Job, batchv1.JobCondition{Type: batchv1.JobFailed, Status: corev1.ConditionTrue})
		f := newControl(t, t0, stateObject(t, op), failed, talosSecret())

		got, err := f.ctl.Resume(ctx, nil)
		require.NoError(t, err)
		assert.Equal(t, 2, got.Status.Attempt)
		assert.Equal(t, "ichor-op-1-2", got.Status.Job)

		state, err := f.ctl.Get(ctx)
		require.NoError(t, err)
		assert.Equal(t, api.PhasePending, state.Status.Phase)
		assert.Empty(t, state.Status.Reason)
		assert.Empty(t, state.Status.PausedNode)

		_, err = f.kube.BatchV1().Jobs("ichor-system").Get(ctx, "ichor-op-1-1", metav1.GetOptions{})
		assert.True(t, apierrors.IsNotFound(err), "the old Job is deleted")
		_, err = f.kube.BatchV1().Jobs("ichor-system").Get(ctx, "ichor-op-1-2", metav1.GetOptions{})
		assert.NoError(t, err)
	})

	t.Run("running, its runner gone", func(t *testing.T) {
		op := testOperation("op-1", api.PhaseRunning)
		f := newControl(t, t0, stateObject(t, op), runnerJob(op.Status.Job), runnerPod("pod-a", op.Status.Job, corev1.PodFailed), talosSecret())

		got, err := f.ctl.Resume(ctx, nil)
		require.NoError(t, err)
		assert.Equal(t, "ichor-op-1-2", got.Status.Job)
	})

	tests := []struct {
		name string
		op   *api.Operation
		objs []runtime.Object
		want string
	}{
		{
			name: "a live runner", op: testOperation("op-1", api.PhaseRunning),
			objs: []runtime.Object{heldLease("ichor-system/pod-a", t0), runnerPod("pod-a", "ichor-op-1-1", corev1.PodRunning)},
			want: "operation op-1 is running (pod ichor-system/pod-a holds the lock): nothing to resume; follow it with kubectl ichor status --watch",
		},
		{
			name: "a pod still starting", op: testOperation("op-1", api.PhasePending),
			objs: []runtime.Object{runnerPod("pod-b", "ichor-op-1-1", corev1.PodPending)},
			want: "operation op-1 is pending in pod pod-b: nothing to resume",
		},
		{name: "succeeded", op: testOperation("op-1", api.PhaseSucceeded), want: "operation op-1 succeeded: nothing to resume"},
		{name: "aborted", op: testOperation("op-1", api.PhaseAborted), want: "operation op-1 was aborted: start a new one with kubectl ichor upgrade"},
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
