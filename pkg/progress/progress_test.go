package progress_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	api "github.com/ichor-dev/kubectl-ichor/pkg/api/v1alpha1"
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
func running(stage string, done ...time.Duration) *job.Operation {
	started := metav1.NewTime(t0)
	op := &job.Operation{Status: job.OperationStatus{Phase: job.PhaseRunning, StartedAt: &started}}
	names := []string{"cp-1", "cp-2", "cp-3", "worker-1", "worker-2"}

	for i, d := range done {
		op.Status.SetNode(stage, names[i], stages.PhaseApplying, "", t0.Add(d-10*time.Second))
		op.Status.SetNode(stage, names[i], stages.PhaseDone, "", t0.Add(d))
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
	op.Status.Phase = job.PhaseSucceeded
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
