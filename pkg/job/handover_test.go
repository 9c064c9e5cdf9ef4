package job

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	batchv1 "k8s.io/api/batch/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/utils/ptr"

	api "github.com/ichor-dev/kubectl-ichor/pkg/api/v1alpha1"
)

const handJob = "ichor-op-1-1"

// jobOf is a Job at parallelism n.
func jobOf(n int32) *batchv1.Job {
	j := runnerJob(handJob)
	j.Spec.Parallelism = ptr.To(n)

	return j
}

// podOf is a pod of handJob on node.
func podOf(name, node string, phase corev1.PodPhase) *corev1.Pod {
	p := runnerPod(name, handJob, phase)
	p.Spec.NodeName = node
	p.OwnerReferences = []metav1.OwnerReference{{APIVersion: "batch/v1", Kind: "Job", Name: handJob, Controller: ptr.To(true)}}

	return p
}

func withCompletions(j *batchv1.Job) *batchv1.Job {
	j.Spec.Completions = ptr.To[int32](1)

	return j
}

func unschedulable(p *corev1.Pod) *corev1.Pod {
	p.Spec.NodeName = ""
	p.Status.Conditions = []corev1.PodCondition{{
		Type: corev1.PodScheduled, Status: corev1.ConditionFalse, Reason: corev1.PodReasonUnschedulable,
		Message: "0/8 nodes are available: 8 node(s) were unschedulable.",
	}}

	return p
}

func parallelism(t *testing.T, c *fake.Clientset) int32 {
	t.Helper()

	j, err := c.BatchV1().Jobs("ichor-system").Get(context.Background(), handJob, metav1.GetOptions{})
	require.NoError(t, err)

	return *j.Spec.Parallelism
}

func TestHandOver(t *testing.T) {
	self := func() *corev1.Pod { return podOf("runner-a", "worker-3", corev1.PodRunning) }
	forbidden := func(c *fake.Clientset) {
		c.PrependReactor("patch", "jobs", func(k8stesting.Action) (bool, runtime.Object, error) {
			return true, nil, apierrors.NewForbidden(schema.GroupResource{Group: "batch", Resource: "jobs"}, handJob, errors.New("RBAC"))
		})
	}

	tests := []struct {
		name    string
		objs    []runtime.Object
		react   func(*fake.Clientset)
		handed  string // the successor handed over to, "" for none
		wantPar int32  // the Job's parallelism once Complete returned
		log     string
	}{
		{
			name:   "a successor runs on another node",
			objs:   []runtime.Object{jobOf(1), self(), podOf("runner-b", "cp-1", corev1.PodRunning)},
			handed: "runner-b", wantPar: 2,
			log: "hand-over: successor runner-b runs on node cp-1",
		},
		{
			name:    "the successor cannot be scheduled",
			objs:    []runtime.Object{jobOf(1), self(), unschedulable(podOf("runner-b", "", corev1.PodPending))},
			wantPar: 1,
			log:     "hand-over: successor runner-b cannot be scheduled: 0/8 nodes are available: 8 node(s) were unschedulable.: the drain evicts this runner",
		},
		{
			name:    "no successor runs in time",
			objs:    []runtime.Object{jobOf(1), self(), podOf("runner-b", "cp-1", corev1.PodPending)},
			wantPar: 1,
			log:     "hand-over: no successor ran within 300ms (not started): the drain evicts this runner",
		},
		{
			name:    "a pod on the runner's own node is no successor",
			objs:    []runtime.Object{jobOf(1), self(), podOf("runner-b", "worker-3", corev1.PodRunning)},
			wantPar: 1,
			log:     "no successor ran within 300ms",
		},
		{
			name:    "a Job with completions runs no second pod",
			objs:    []runtime.Object{withCompletions(jobOf(1)), self(), podOf("runner-b", "cp-1", corev1.PodRunning)},
			wantPar: 1,
			log:     "hand-over: cannot start a successor pod (job ichor-system/ichor-op-1-1 has completions 1: it runs no second pod): the drain evicts this runner",
		},
		{
			name:    "the patch is refused",
			objs:    []runtime.Object{jobOf(1), self(), podOf("runner-b", "cp-1", corev1.PodRunning)},
			react:   forbidden,
			wantPar: 1,
			log:     `hand-over: cannot start a successor pod (set the parallelism of job ichor-system/ichor-op-1-1 to 2: jobs.batch "ichor-op-1-1" is forbidden: RBAC): the drain evicts this runner`,
		},
	}

	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := fake.NewClientset(tt.objs...)
			if tt.react != nil {
				tt.react(c)
			}

			out := &syncBuffer{}
			r := &Runner{Kube: c, Namespace: "ichor-system", Identity: "runner-a", Node: "worker-3", Out: out}

			var stopped error

			h := &handOver{r: r, stop: func(err error) { stopped = err }, poll: 20 * time.Millisecond, startTimeout: 300 * time.Millisecond}

			ctx := context.Background()
			h.Prepare(ctx)
			got := h.Complete(ctx)

			assert.Equal(t, tt.handed != "", got)
			assert.Equal(t, tt.wantPar, parallelism(t, c), "the Job's parallelism")
			assert.Contains(t, out.String(), tt.log)

			if tt.handed == "" {
				assert.NoError(t, stopped, "the run goes on")
				to, _ := h.handedTo()
				assert.Nil(t, to)

				return
			}

			assert.ErrorIs(t, stopped, errHandedOver, "the engine is stopped")
			to, _ := h.handedTo()
			require.NotNil(t, to)
			assert.Equal(t, tt.handed, to.Name)
		})
	}
}

func TestSettleParallelism(t *testing.T) {
	self := podOf("runner-b", "cp-1", corev1.PodRunning)

	handed := podOf("runner-a", "worker-3", corev1.PodFailed)
	handed.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: ContainerName, State: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: ExitHandedOver}}}}

	tests := []struct {
		name  string
		objs  []runtime.Object
		asked bool
		want  int32
	}{
		{name: "the holder alone: back to 1", objs: []runtime.Object{jobOf(2), self, handed}, want: 1},
		{name: "a candidate waits: left at 2", objs: []runtime.Object{jobOf(2), self, podOf("runner-c", "cp-2", corev1.PodRunning)}, want: 2},
		{name: "the holder hands over itself: left at 2", objs: []runtime.Object{jobOf(2), self, handed}, asked: true, want: 2},
		{name: "already 1", objs: []runtime.Object{jobOf(1), self}, want: 1},
	}

	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := fake.NewClientset(tt.objs...)
			r := &Runner{Kube: c, Namespace: "ichor-system", Identity: "runner-b", Node: "cp-1", Out: &syncBuffer{}}

			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			defer cancel()

			h := &handOver{r: r}
			if tt.asked {
				h.asked = time.Now()
			}

			r.settleParallelism(ctx, h)
			assert.Equal(t, tt.want, parallelism(t, c))
		})
	}
}

// TestRunnerHandsOver: an engine that hands over stops; the runner writes its end,
// releases the lock, waits for its successor to hold it, and exits with ExitHandedOver.
func TestRunnerHandsOver(t *testing.T) {
	op := testOperation("op-1", api.PhasePending)
	op.Spec.Upgrade = api.UpgradeTalos

	self := podOf("runner-pod-1", "cp-2", corev1.PodRunning)
	successor := podOf("runner-pod-2", "worker-1", corev1.PodRunning)

	f := newRunner(t, op, func(ctx context.Context, cfg EngineConfig) error {
		h := cfg.Options.HandOver
		if h == nil {
			return errors.New("no hand-over")
		}

		h.Prepare(ctx)

		if !h.Complete(ctx) {
			return errors.New("not handed over")
		}

		<-ctx.Done()

		return ctx.Err()
	}, jobOf(1), successor)
	require.NoError(t, f.client.Tracker().Update(schema.GroupVersionResource{Version: "v1", Resource: "pods"}, self, "ichor-system"))

	// The successor takes the lock once it is released.
	var wg sync.WaitGroup
	defer wg.Wait()

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	wg.Go(func() {
		for ctx.Err() == nil {
			l, err := f.client.CoordinationV1().Leases(LockNamespace).Get(ctx, LockName, metav1.GetOptions{})
			if err == nil && l.Spec.HolderIdentity != nil && *l.Spec.HolderIdentity == "" {
				l.Spec = coordinationv1.LeaseSpec{
					HolderIdentity: ptr.To("ichor-system/runner-pod-2"), LeaseDurationSeconds: ptr.To[int32](30),
					RenewTime: ptr.To(metav1.NewMicroTime(time.Now())),
				}
				_, _ = f.client.CoordinationV1().Leases(LockNamespace).Update(ctx, l, metav1.UpdateOptions{})

				return
			}

			time.Sleep(10 * time.Millisecond)
		}
	})

	err := f.runner.Run(context.Background())
	require.Equal(t, ExitHandedOver, exitCode(err), "%v\n%s", err, f.out.String())
	assert.EqualError(t, err, "handed over to ichor-system/runner-pod-2")

	s := f.state(t).Status
	assert.Equal(t, api.PhaseRunning, s.Phase, "the operation goes on")
	require.Len(t, s.Runners, 1)
	assert.NotNil(t, s.Runners[0].Ended, "its end is recorded")
	assert.Equal(t, 2, int(parallelism(t, f.client)), "left to the successor to set back")
	assert.Contains(t, f.out.String(), "hand-over: ichor-system/runner-pod-2 took the lock")
}
