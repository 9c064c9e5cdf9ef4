package job

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
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

	handed := runnerPod("pod-d", op.Status.Job, corev1.PodFailed)
	handed.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: ContainerName, State: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: ExitHandedOver}}}}

	rebooting := testOperation("op-1", api.PhaseRunning)
	rebooting.Status.Nodes = []api.NodeStatus{{Name: "worker-1", Stage: "Talos", Phase: "Upgrading"}}

	tests := []struct {
		name  string
		op    *api.Operation
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
		{name: "a hand-over is no failure", objs: []runtime.Object{runnerJob(op.Status.Job), handed}},
		{
			name: "runner on a lost node", objs: []runtime.Object{runnerJob(op.Status.Job), onNode("pod-a", op.Status.Job, "worker-1"), lostNode("worker-1")},
			want: "runner pod pod-a is on node worker-1, not Ready (for 2m0s: NodeStatusUnknown): the Job starts another runner once that pod is gone, " +
				"which takes worker-1 back; if worker-1 is down for good, mark it out of service: " +
				"kubectl taint node worker-1 node.kubernetes.io/out-of-service=nodeshutdown:NoExecute",
		},
		{
			name: "runner on a node the upgrade reboots", op: rebooting,
			objs: []runtime.Object{runnerJob(op.Status.Job), onNode("pod-a", op.Status.Job, "worker-1"), lostNode("worker-1")},
			want: "runner pod pod-a is on node worker-1, not Ready (for 2m0s: NodeStatusUnknown, in its upgrade): the Job starts another runner once that pod is gone, " +
				"which takes worker-1 back; if worker-1 is down for good, mark it out of service: " +
				"kubectl taint node worker-1 node.kubernetes.io/out-of-service=nodeshutdown:NoExecute",
		},
		{name: "runner on a Ready node", objs: []runtime.Object{runnerJob(op.Status.Job), onNode("pod-a", op.Status.Job, "worker-1"), readyNode("worker-1", corev1.ConditionTrue)}},
		{
			name: "runner on a node whose kubelet restarts", // it posts NotReady, and the pod runs on
			objs: []runtime.Object{runnerJob(op.Status.Job), onNode("pod-a", op.Status.Job, "worker-1"), readyNode("worker-1", corev1.ConditionFalse)},
		},
		{name: "runner on a node it cannot read", objs: []runtime.Object{runnerJob(op.Status.Job), onNode("pod-a", op.Status.Job, "worker-1")}},
	}

	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newControl(t, t0.Add(time.Hour), tt.objs...)

			o := op
			if tt.op != nil {
				o = tt.op
			}

			p, err := f.ctl.Diagnose(context.Background(), o)
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

// onNode is a running runner pod on node.
func onNode(name, job, node string) *corev1.Pod {
	p := runnerPod(name, job, corev1.PodRunning)
	p.Spec.NodeName = node

	return p
}

// lostNode is a Node whose kubelet stopped posting its status two minutes before the
// tests' now (t0 plus an hour).
func lostNode(name string) *corev1.Node {
	return &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}, Status: corev1.NodeStatus{Conditions: []corev1.NodeCondition{{
		Type: corev1.NodeReady, Status: corev1.ConditionUnknown, Reason: "NodeStatusUnknown",
		LastTransitionTime: metav1.NewTime(t0.Add(58 * time.Minute)),
	}}}}
}

func readyNode(name string, status corev1.ConditionStatus) *corev1.Node {
	return &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}, Status: corev1.NodeStatus{Conditions: []corev1.NodeCondition{{
		Type: corev1.NodeReady, Status: status, Reason: "KubeletNotReady",
	}}}}
}
