package job

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"

	api "github.com/ichor-dev/kubectl-ichor/pkg/api/v1alpha1"
)

func TestDiagnose(t *testing.T) {
	op := testOperation("op-1", api.PhaseRunning)
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
