package progress_test

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	api "github.com/ichor-dev/kubectl-ichor/pkg/api/v1alpha1"
	"github.com/ichor-dev/kubectl-ichor/pkg/engine"
	"github.com/ichor-dev/kubectl-ichor/pkg/job"
	"github.com/ichor-dev/kubectl-ichor/pkg/progress"
	"github.com/ichor-dev/kubectl-ichor/pkg/stages"
)

var t0 = time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)

// plan3x2 is a Talos upgrade of three control planes and two workers, one
// at a time.
func plan3x2() *api.Plan {
	var nodes []api.NodeStep
	for i, n := range []string{"cp-1", "cp-2", "cp-3", "worker-1", "worker-2"} {
		nodes = append(nodes, api.NodeStep{Node: n, Batch: i + 1})
	}

	return &api.Plan{Stages: []api.Stage{{Name: "TalosOS", Nodes: nodes}}}
}

// running is an operation started at t0 whose nodes were done at the given
// offsets, in plan order.
func running(stage string, done ...time.Duration) *api.Operation {
	started := metav1.NewTime(t0)
	op := &api.Operation{Status: api.OperationStatus{Phase: api.PhaseRunning, StartedAt: &started}}
	names := []string{"cp-1", "cp-2", "cp-3", "worker-1", "worker-2"}

	for i, d := range done {
		job.SetNode(&op.Status, stage, names[i], engine.PhaseApplying, "", t0.Add(d-10*time.Second))
		job.SetNode(&op.Status, stage, names[i], engine.PhaseDone, "", t0.Add(d))
	}

	return op
}

func TestNothingMeasuredNoEstimate(t *testing.T) {
	p := progress.Of(running("TalosOS"), plan3x2(), t0.Add(30*time.Second))

	assert.Equal(t, 0, p.Done)
	assert.Equal(t, 5, p.Total)
	assert.Equal(t, int64(30), p.ElapsedSeconds)
	assert.Nil(t, p.RemainingSeconds, "no batch measured yet")
}

func TestEstimateFromTheBatchesMeasured(t *testing.T) {
	// Two nodes done, one a minute: three left at a minute each, the third
	// under way for 20 s.
	p := progress.Of(running("TalosOS", time.Minute, 2*time.Minute), plan3x2(), t0.Add(2*time.Minute+20*time.Second))

	assert.Equal(t, 2, p.Done)
	require.NotNil(t, p.RemainingSeconds)
	assert.Equal(t, int64(3*60-20), *p.RemainingSeconds)
	assert.Equal(t, []progress.Stage{{Name: "TalosOS", Done: 2, Total: 5, Batches: 5, BatchSeconds: 60}}, p.Stages)
	assert.Contains(t, p.Basis, "2 batches measured")
}

func TestAStageNotReachedTakesItsKindsPace(t *testing.T) {
	plan := &api.Plan{Stages: []api.Stage{
		{Name: "APIServers", Nodes: []api.NodeStep{{Node: "cp-1", Batch: 1}, {Node: "cp-2", Batch: 2}}},
		{Name: "ControlPlaneComponents", Nodes: []api.NodeStep{{Node: "cp-1", Batch: 1}, {Node: "cp-2", Batch: 2}}},
		{Name: "KubeProxy", Skipped: true},
	}}

	op := running("APIServers", 30*time.Second, 60*time.Second)
	p := progress.Of(op, plan, t0.Add(60*time.Second))

	require.NotNil(t, p.RemainingSeconds)
	assert.Equal(t, int64(60), *p.RemainingSeconds, "two static pod batches at 30 s each")
	assert.Len(t, p.Stages, 2, "a skipped stage has no progress")
}

func TestFinishedHasNoEstimate(t *testing.T) {
	op := running("TalosOS", 1*time.Minute, 2*time.Minute, 3*time.Minute, 4*time.Minute, 5*time.Minute)
	op.Status.Phase = api.PhaseSucceeded
	end := metav1.NewTime(t0.Add(5 * time.Minute))
	op.Status.FinishedAt = &end

	p := progress.Of(op, plan3x2(), t0.Add(time.Hour))

	assert.Equal(t, 5, p.Done)
	assert.Equal(t, int64(300), p.ElapsedSeconds)
	assert.Nil(t, p.RemainingSeconds)
}

func TestWithoutAPlanOnlyTheElapsedTime(t *testing.T) {
	p := progress.Of(running("TalosOS", time.Minute), nil, t0.Add(90*time.Second))

	assert.Equal(t, int64(90), p.ElapsedSeconds)
	assert.Zero(t, p.Total)
	assert.Nil(t, p.RemainingSeconds)
}

// at is t0 plus s seconds.
func at(s float64) time.Time { return t0.Add(time.Duration(s * float64(time.Second))) }

// kubePlan is a Kubernetes upgrade of three control planes and four workers,
// two at a time, with kube-proxy on every node, one pod at a time; the runner
// on worker-4 (it goes last).
func kubePlan() *api.Plan {
	cps := []string{"cp-1", "cp-2", "cp-3"}
	proxy := []api.Change{{Component: "kube-proxy"}}

	var apis, cpcs, proxies, kubelets []api.NodeStep

	for i, n := range cps {
		apis = append(apis, api.NodeStep{Node: n, Batch: i + 1})
		cpcs = append(cpcs, api.NodeStep{Node: n, Batch: i + 1})
		proxies = append(proxies, api.NodeStep{Node: n, Batch: i + 1, Changes: proxy})
		kubelets = append(kubelets, api.NodeStep{Node: n, Batch: i + 1})
	}

	for i, n := range []string{"worker-1", "worker-2", "worker-3", "worker-4"} {
		kubelets = append(kubelets, api.NodeStep{Node: n, Batch: 4 + i/2, Self: n == "worker-4"})
	}

	return &api.Plan{
		Cluster: api.Cluster{ControlPlanes: 3, Workers: 4},
		Stages: []api.Stage{
			{Name: "APIServers", Nodes: apis},
			{Name: "ControlPlaneComponents", Nodes: cpcs},
			{Name: "KubeProxy", Nodes: proxies, Rollout: &api.Rollout{DaemonSet: "kube-system/kube-proxy", Pods: 7, MaxUnavailable: 1}},
			{Name: "Kubelets", Nodes: kubelets},
		},
	}
}

// timeline builds an operation launched at t0 (0.2 s in: the spec's time is
// truncated to the second) whose first runner, on node, took the lock 2 s
// later (a pod's start of 2 s).
type timeline struct{ op *api.Operation }

func newTimeline(node string) *timeline {
	op := &api.Operation{Spec: api.OperationSpec{CreatedAt: metav1.NewTime(t0)}, Status: api.OperationStatus{Phase: api.PhaseRunning}}
	launched := metav1.NewMicroTime(at(0.2))
	op.Status.LaunchedAt = &launched
	op.Status.StartRunner("runner-1", node, false, t0, at(2.2))
	op.Status.Runs = 1
	started := metav1.NewTime(at(2))
	op.Status.StartedAt = &started

	return &timeline{op: op}
}

// done marks the nodes done in stage at s seconds.
func (tl *timeline) done(stage string, s float64, nodes ...string) *timeline {
	for _, n := range nodes {
		job.SetNode(&tl.op.Status, stage, n, engine.PhaseApplying, "", at(s-0.5))
		job.SetNode(&tl.op.Status, stage, n, engine.PhaseDone, "", at(s))
	}

	return tl
}

// controlPlanes marks the three control planes done in stage, one every
// 3 s from s + 3.
func (tl *timeline) controlPlanes(stage string, s float64) *timeline {
	return tl.done(stage, s+3, "cp-1").done(stage, s+6, "cp-2").done(stage, s+9, "cp-3")
}

func left(t *testing.T, p progress.Progress) float64 {
	t.Helper()
	require.NotNil(t, p.RemainingSeconds, "an estimate")

	return float64(*p.RemainingSeconds)
}

func TestRolloutNotStartedTakesAPodsStartPerPod(t *testing.T) {
	// APIServers done at 5, 8, 11: 3 s a batch. Left: 3 + 3 batches of
	// 3 s, the rollout's 7 pods at the runner's pod start (2 s), 5
	// Kubelets batches of 3 s; no replacement: the runner stays on
	// worker-4 through its kubelet's restart.
	tl := newTimeline("worker-4").controlPlanes("APIServers", 2)
	p := progress.Of(tl.op, kubePlan(), at(11))

	assert.InDelta(t, 6*3+7*2+5*3, left(t, p), 1)
	assert.Contains(t, p.Basis, "rollout 7 of 7 pods left at 2s per 1 (a pod's start, the runner's)")
	assert.NotContains(t, p.Basis, "replacement")
}

func TestRolloutUnderWayTakesItsOwnPace(t *testing.T) {
	// The first manifest sync at 29 changed the DaemonSet; by 37 it had
	// updated 4 of 7 pods: 2 s a pod, 3 left, observed 1 s ago.
	tl := newTimeline("worker-4").controlPlanes("APIServers", 2).controlPlanes("ControlPlaneComponents", 11).
		done("KubeProxy", 29, "cp-1").done("KubeProxy", 30, "cp-2").done("KubeProxy", 31, "cp-3")
	s := &tl.op.Status
	job.SetStep(s, "KubeProxy", engine.StepManifests, engine.StepTiming{Done: true}, at(29))
	job.SetStep(s, "KubeProxy", engine.StepRollout, engine.StepTiming{Pods: 7, Updated: 1, MaxUnavailable: 1}, at(31))
	job.SetStep(s, "KubeProxy", engine.StepRollout, engine.StepTiming{Pods: 7, Updated: 4, MaxUnavailable: 1}, at(37))

	p := progress.Of(tl.op, kubePlan(), at(38))

	// 3 pods at 2 s less the second since, 5 Kubelets batches at the
	// median of every batch (3 s: the KubeProxy ones, 1 s, are fewer).
	assert.InDelta(t, 3*2-1+5*3, left(t, p), 1)
	assert.Contains(t, p.Basis, "rollout 3 of 7 pods left at 2s per 1 measured")
}

func TestTheRolloutIsInNoBatch(t *testing.T) {
	// The rollout ran from 31 to 61; the first Kubelets batch was done 3 s
	// after it: its cycle is 3 s, not 33 s, and nothing of the rollout is
	// left.
	tl := newTimeline("worker-4").controlPlanes("APIServers", 2).controlPlanes("ControlPlaneComponents", 11).
		done("KubeProxy", 29, "cp-1").done("KubeProxy", 30, "cp-2").done("KubeProxy", 31, "cp-3").
		done("Kubelets", 64, "cp-1")
	s := &tl.op.Status
	job.SetStep(s, "KubeProxy", engine.StepManifests, engine.StepTiming{Done: true}, at(29))
	job.SetStep(s, "KubeProxy", engine.StepRollout, engine.StepTiming{}, at(31))
	job.SetStep(s, "KubeProxy", engine.StepRollout, engine.StepTiming{Done: true, Pods: 7, Updated: 7, MaxUnavailable: 1}, at(61))

	p := progress.Of(tl.op, kubePlan(), at(64))

	require.Len(t, p.Stages, 4)
	assert.Equal(t, int64(3), p.Stages[3].BatchSeconds, "the first Kubelets batch without the rollout")
	assert.InDelta(t, 4*3, left(t, p), 1, "four batches")
	assert.NotContains(t, p.Basis, "rollout")
}

func TestRunnerReplacement(t *testing.T) {
	// TalosOS, one node at a time: cp-1 to worker-1 done at 10, 20, 30, 40;
	// the runner's node, worker-2, is the last batch: its drain evicts the
	// runner before the reboot.
	base := func() *timeline {
		return newTimeline("worker-2").done("TalosOS", 10, "cp-1").done("TalosOS", 20, "cp-2").
			done("TalosOS", 30, "cp-3").done("TalosOS", 40, "worker-1")
	}
	plan := func() *api.Plan {
		p := plan3x2()
		p.Stages[0].Nodes[4].Self = true

		return p
	}

	t.Run("to come: a hand-over, a pod's start", func(t *testing.T) {
		p := progress.Of(base().op, plan(), at(40))

		assert.InDelta(t, 2+10, left(t, p), 1, "the hand-over, then the last batch")
		assert.Contains(t, p.Basis, "runner hand-over 2s (a pod's start)")
	})

	t.Run("under way: the time without a runner counts", func(t *testing.T) {
		tl := base()
		job.SetNode(&tl.op.Status, "TalosOS", "worker-2", engine.PhaseDraining, "", at(41))
		tl.op.Status.EndRunner(at(42))

		p := progress.Of(tl.op, plan(), at(43))

		assert.InDelta(t, 2-1+10, left(t, p), 1)
	})

	t.Run("done: measured, and in no batch", func(t *testing.T) {
		// One more node after the runner's: worker-3.
		tl := base()
		tl.op.Status.EndRunner(at(42))
		tl.op.Status.StartRunner("runner-2", "cp-2", false, t0, at(53))
		tl.op.Status.Runs = 2
		tl.done("TalosOS", 63, "worker-2")

		p := plan()
		p.Stages[0].Nodes = append(p.Stages[0].Nodes, api.NodeStep{Node: "worker-3", Batch: 6})

		got := progress.Of(tl.op, p, at(63))

		assert.Equal(t, int64(10), got.Stages[0].BatchSeconds, "the batch of the replacement without its 11 s")
		assert.InDelta(t, 10, left(t, got), 1, "one batch; the runner, on cp-2, is not replaced again")
	})

	t.Run("a Kubernetes upgrade's runner stays on its node through its kubelet's restart", func(t *testing.T) {
		// Kubelets: the control planes done at 40, 43, 46, workers 1 and 2
		// at 49; the runner's node, worker-4, is in the last batch.
		tl := newTimeline("worker-4").controlPlanes("APIServers", 2).controlPlanes("ControlPlaneComponents", 11).
			controlPlanes("KubeProxy", 20).controlPlanes("Kubelets", 37).done("Kubelets", 49, "worker-1", "worker-2")
		s := &tl.op.Status
		job.SetStep(s, "KubeProxy", engine.StepRollout, engine.StepTiming{}, at(29))
		job.SetStep(s, "KubeProxy", engine.StepRollout, engine.StepTiming{Done: true, Pods: 7, Updated: 7, MaxUnavailable: 1}, at(37))

		p := progress.Of(tl.op, kubePlan(), at(49))

		assert.InDelta(t, 3, left(t, p), 1, "the last batch only")
		assert.NotContains(t, p.Basis, "replacement")
	})
}

func TestRunnerStayingOnItsNodeIsReplacedAfterItsReboot(t *testing.T) {
	// A Talos upgrade whose runner's pod stays on cp-3 through its drain:
	// the reboot takes it down, and the Job's next pod continues.
	plan := &api.Plan{
		Cluster: api.Cluster{ControlPlanes: 3},
		Stages: []api.Stage{{Name: "TalosOS", Nodes: []api.NodeStep{
			{Node: "cp-1", Batch: 1}, {Node: "cp-2", Batch: 2}, {Node: "cp-3", Batch: 3, Self: true},
		}}},
	}
	tl := newTimeline("cp-3").done("TalosOS", 12, "cp-1").done("TalosOS", 22, "cp-2")
	tl.op.Status.Runners[0].StaysOnNode = true

	p := progress.Of(tl.op, plan, at(22))

	assert.Contains(t, p.Basis, "runner replacement")
	assert.InDelta(t, 12+10, left(t, p), 1, "the replacement, then the last batch")
}

func TestResumedOperationKeepsWhatItMeasured(t *testing.T) {
	// The rollout was measured and done before the pause; the operation
	// paused at 50 in the Kubelets stage and was resumed an hour later.
	tl := newTimeline("cp-1").controlPlanes("APIServers", 2).controlPlanes("ControlPlaneComponents", 11).
		done("KubeProxy", 21, "cp-1").done("KubeProxy", 22, "cp-2").done("KubeProxy", 23, "cp-3").
		done("Kubelets", 40, "cp-1", "cp-2")
	s := &tl.op.Status
	job.SetStep(s, "KubeProxy", engine.StepManifests, engine.StepTiming{Done: true}, at(21))
	job.SetStep(s, "KubeProxy", engine.StepRollout, engine.StepTiming{}, at(23))
	job.SetStep(s, "KubeProxy", engine.StepRollout, engine.StepTiming{Done: true, Pods: 7, Updated: 7, MaxUnavailable: 1}, at(37))
	s.EndRunner(at(41))
	s.AddPause("Kubelets", "cp-3", "drain: a budget", at(41))
	s.StartRunner("runner-2", "worker-1", true, t0, at(3641))
	s.Runs = 2
	tl.done("Kubelets", 3643, "cp-3")

	plan := kubePlan()
	plan.Stages[3].Nodes = slices.DeleteFunc(plan.Stages[3].Nodes, func(n api.NodeStep) bool { return n.Node == "cp-2" })
	p := progress.Of(tl.op, plan, at(3644))

	// Kubelets: cp-1 after the rollout (3 s), cp-3 across the pause (1 s
	// before it and 2 s after: the hour without a runner left out).
	assert.Equal(t, int64(3), p.Stages[3].BatchSeconds)
	// Left: workers 1-2 (the runner's node, worker-1: it stays through its
	// kubelet's restart), workers 3-4; no rollout.
	assert.InDelta(t, 3+3, left(t, p), 1)
	assert.NotContains(t, p.Basis, "rollout")
}

func TestStageWorkFromTheStageTypes(t *testing.T) {
	for name, want := range map[string]stages.Work{
		"APIServers": stages.WorkStaticPods, "ControlPlaneComponents": stages.WorkStaticPods,
		"KubeProxy": stages.WorkConfig, "Kubelets": stages.WorkDrain, "TalosOS": stages.WorkReboot, "Unknown": "",
	} {
		assert.Equal(t, want, stages.StageWork(name), name)
	}

	assert.True(t, stages.WorkDrain.Drains())
	assert.True(t, stages.WorkReboot.Drains())
	assert.False(t, stages.WorkStaticPods.Drains())
}

// TestOfPath: a path's time left is the hop under way's own estimate, or the median of
// the done hops of its kind less what it has run, plus the median of its kind for each
// hop to come; until every kind still to come is measured it says what it waits for.
func TestOfPath(t *testing.T) {
	t0 := time.Date(2026, 12, 3, 12, 0, 0, 0, time.UTC)
	at := func(s int) *metav1.MicroTime {
		m := metav1.NewMicroTime(t0.Add(time.Duration(s) * time.Second))
		return &m
	}

	op := &api.Operation{Spec: api.OperationSpec{Upgrade: api.UpgradeCluster, Hops: []api.HopSpec{
		{Upgrade: api.UpgradeTalos, To: "v1.14.1"},
		{Upgrade: api.UpgradeKubernetes, To: "v1.34.5"},
		{Upgrade: api.UpgradeKubernetes, To: "v1.35.4"},
		{Upgrade: api.UpgradeKubernetes, To: "v1.36.3"},
	}}}
	op.Status.Phase = api.PhaseRunning
	op.Status.Hop = 2
	op.Status.Hops = []api.HopStatus{
		{Number: 1, Upgrade: api.UpgradeTalos, Started: *at(0), Done: at(120)},
		{Number: 2, Upgrade: api.UpgradeKubernetes, Started: *at(120)},
	}

	p := progress.OfPath(op, progress.Progress{}, t0.Add(150*time.Second))
	require.NotNil(t, p)
	assert.Equal(t, 2, p.Hop)
	assert.Equal(t, 4, p.Hops)
	assert.Equal(t, 1, p.Done)
	assert.Nil(t, p.RemainingSeconds, "no Kubernetes hop measured yet")
	assert.Equal(t, "no estimate until a kubernetes hop is measured", p.Basis)

	// Hop 2 done in 60s; hop 3 has run 20s of its 60s.
	op.Status.Hops[1].Done = at(180)
	op.Status.Hop = 3
	op.Status.Hops = append(op.Status.Hops, api.HopStatus{Number: 3, Upgrade: api.UpgradeKubernetes, Started: *at(185)})

	p = progress.OfPath(op, progress.Progress{}, t0.Add(205*time.Second))
	require.NotNil(t, p.RemainingSeconds)
	assert.Equal(t, int64(40+60), *p.RemainingSeconds)
	assert.Equal(t, "hops done: talos 2m0s (1 measured), kubernetes 1m0s (1 measured)", p.Basis)

	// The hop under way's own estimate, when its plan gives one, comes first.
	own := int64(10)
	p = progress.OfPath(op, progress.Progress{RemainingSeconds: &own}, t0.Add(205*time.Second))
	assert.Equal(t, int64(10+60), *p.RemainingSeconds)

	// Between hops (hop 3 done, paused): every hop after it.
	op.Status.Hops[2].Done = at(245)
	op.Status.Phase = api.PhasePaused
	p = progress.OfPath(op, progress.Progress{}, t0.Add(300*time.Second))
	assert.Equal(t, int64(60), *p.RemainingSeconds)

	assert.Nil(t, progress.OfPath(&api.Operation{Spec: api.OperationSpec{Upgrade: api.UpgradeKubernetes, Target: "v1.36.3"}}, progress.Progress{}, t0), "not a path")
}

func TestWorkerBatchesTakeTheirOwnPace(t *testing.T) {
	// Kubelets: the control planes done at 42, 47 and 52, 5 s each (their
	// new kubelets restart their static pods); the workers' batches are
	// shorter. The batches before: APIServers and ControlPlaneComponents
	// 3 s each, KubeProxy 1 s each, its rollout from 23 to 37.
	plan := kubePlan()
	for i := range plan.Stages[3].Nodes {
		if n := &plan.Stages[3].Nodes[i]; strings.HasPrefix(n.Node, "worker-") {
			n.Role = api.RoleWorker
		}
	}

	tl := newTimeline("worker-4").controlPlanes("APIServers", 2).controlPlanes("ControlPlaneComponents", 11).
		done("KubeProxy", 21, "cp-1").done("KubeProxy", 22, "cp-2").done("KubeProxy", 23, "cp-3").
		done("Kubelets", 42, "cp-1").done("Kubelets", 47, "cp-2").done("Kubelets", 52, "cp-3")
	s := &tl.op.Status
	job.SetStep(s, "KubeProxy", engine.StepRollout, engine.StepTiming{}, at(23))
	job.SetStep(s, "KubeProxy", engine.StepRollout, engine.StepTiming{Done: true, Pods: 7, Updated: 7, MaxUnavailable: 1}, at(37))

	// No worker batch measured: the median of every batch (3 s), not the
	// control planes' 5 s.
	assert.InDelta(t, 2*3, left(t, progress.Of(tl.op, plan, at(52))), 1)

	// One measured, 2 s: the other takes its pace.
	tl.done("Kubelets", 54, "worker-1", "worker-2")
	assert.InDelta(t, 2, left(t, progress.Of(tl.op, plan, at(54))), 1)
}

// TestBatchesCountedByTheNodesDone: the runner orders the nodes again at the
// stage's start, its own node last, so the plan's first batch of workers
// (worker-1 to worker-5, the runner on worker-1) ends in pieces. Five workers
// done are a batch done, whichever they are: one batch is left, after the
// runner's hand-over, not two.
func TestBatchesCountedByTheNodesDone(t *testing.T) {
	nodes := []api.NodeStep{{Node: "cp-1", Batch: 1, Role: api.RoleControlPlane}}
	for i := 1; i <= 10; i++ {
		nodes = append(nodes, api.NodeStep{Node: fmt.Sprintf("worker-%d", i), Batch: 2 + (i-1)/5, Role: api.RoleWorker})
	}

	plan := &api.Plan{Cluster: api.Cluster{ControlPlanes: 1, Workers: 10}, Stages: []api.Stage{{Name: "TalosOS", Nodes: nodes}}}

	tl := newTimeline("worker-1").done("TalosOS", 10, "cp-1").
		done("TalosOS", 15, "worker-2", "worker-3", "worker-4", "worker-5", "worker-6")

	p := progress.Of(tl.op, plan, at(15))

	assert.InDelta(t, 2+5, left(t, p), 1, "the hand-over (a pod's start), then one batch at the workers' 5 s")
	assert.Equal(t, 6, p.Stages[0].Done)
}

// TestABatchUnderWayFloorsItsUnmeasuredKind: a Talos upgrade whose workers'
// pods take time to stop. The control planes, which evict nothing, took 4 s
// each; the first batch of workers has run 5 s and is not done. Until one is
// done the workers are priced at the control planes' pace, which the batch
// under way has already passed: the two batches after it take at least its
// 5 s. Once one is measured its own pace rules again.
func TestABatchUnderWayFloorsItsUnmeasuredKind(t *testing.T) {
	nodes := []api.NodeStep{
		{Node: "cp-1", Batch: 1, Role: api.RoleControlPlane},
		{Node: "cp-2", Batch: 2, Role: api.RoleControlPlane},
		{Node: "cp-3", Batch: 3, Role: api.RoleControlPlane},
	}
	for i := 1; i <= 6; i++ {
		nodes = append(nodes, api.NodeStep{Node: fmt.Sprintf("worker-%d", i), Batch: 4 + (i-1)/2, Role: api.RoleWorker})
	}

	plan := &api.Plan{Cluster: api.Cluster{ControlPlanes: 3, Workers: 6}, Stages: []api.Stage{{Name: "TalosOS", Nodes: nodes}}}

	tl := newTimeline("cp-1").done("TalosOS", 6, "cp-1").done("TalosOS", 10, "cp-2").done("TalosOS", 14, "cp-3")

	assert.InDelta(t, 3*4, left(t, progress.Of(tl.op, plan, at(15))), 1,
		"1 s into the first batch of workers: the control planes' 4 s, less that second, and 4 s each for the two after it")
	assert.InDelta(t, 2*5, left(t, progress.Of(tl.op, plan, at(19))), 1,
		"5 s into it: its 4 s are spent, and the two after it take at least its 5 s")

	tl.done("TalosOS", 20, "worker-1", "worker-2")
	assert.InDelta(t, 2*6, left(t, progress.Of(tl.op, plan, at(20))), 1, "one batch of workers measured, 6 s: the others take its pace")

	assert.InDelta(t, 6-1+6, left(t, progress.Of(tl.op, plan, at(21))), 1, "its pace, not the floor: the next batch under way for a second")
}
