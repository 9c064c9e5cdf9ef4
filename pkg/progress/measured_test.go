package progress_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	api "github.com/ichor-dev/kubectl-ichor/pkg/api/v1alpha1"
	"github.com/ichor-dev/kubectl-ichor/pkg/progress"
)

// TestMeasuredFrom: a Succeeded operation counts from its start to its end without the
// time it waited for its operator after a pause; a path counts each hop done; an
// operation that did not succeed counts nothing.
func TestMeasuredFrom(t *testing.T) {
	t0 := time.Date(2026, 12, 3, 12, 0, 0, 0, time.UTC)
	ts := func(s int) metav1.Time { return metav1.NewTime(t0.Add(time.Duration(s) * time.Second)) }
	mt := func(s int) metav1.MicroTime { return metav1.NewMicroTime(t0.Add(time.Duration(s) * time.Second)) }
	pt := func(s int) *metav1.MicroTime { m := mt(s); return &m }

	plain := &api.Operation{Spec: api.OperationSpec{Upgrade: api.UpgradeKubernetes, Target: "v1.36.3"}}
	plain.Status.Phase = api.PhaseSucceeded
	start, end := ts(0), ts(400)
	plain.Status.StartedAt, plain.Status.FinishedAt = &start, &end
	// Paused at 100 s, resumed by the operator: its runner took the lock at 350 s.
	plain.Status.Runners = []api.RunnerRecord{
		{Pod: "a", Idle: mt(-5), Started: mt(0), Ended: pt(100)},
		{Pod: "b", Idle: mt(100), Started: mt(350), AfterPause: true},
	}

	aborted := &api.Operation{Spec: api.OperationSpec{Upgrade: api.UpgradeTalos, Target: "v1.14.1"}}
	aborted.Status.Phase = api.PhaseAborted

	path := &api.Operation{Spec: api.OperationSpec{Upgrade: api.UpgradeCluster, Hops: []api.HopSpec{
		{Upgrade: api.UpgradeTalos, To: "v1.14.1"}, {Upgrade: api.UpgradeKubernetes, To: "v1.37.2"},
	}}}
	path.Status.Phase = api.PhaseAborted
	path.Status.Hops = []api.HopStatus{
		{Number: 1, Upgrade: api.UpgradeTalos, Started: mt(0), Done: pt(180)},
		{Number: 2, Upgrade: api.UpgradeKubernetes, Started: mt(180)},
	}

	m := progress.MeasuredFrom([]*api.Operation{plain, aborted, path})

	assert.Equal(t, progress.Measured{
		api.UpgradeKubernetes: {150 * time.Second},
		api.UpgradeTalos:      {180 * time.Second},
	}, m)

	d, n, ok := m.Estimate(api.UpgradeTalos)
	assert.True(t, ok)
	assert.Equal(t, 1, n)
	assert.Equal(t, 180*time.Second, d)

	assert.Equal(t, "measured in this cluster's history: talos 3m0s (median of 1), kubernetes 2m30s (median of 1)",
		m.Basis([]string{api.UpgradeTalos, api.UpgradeKubernetes, api.UpgradeKubernetes}))
	assert.Equal(t, "no talos upgrade in the history to measure", progress.Measured{}.Basis([]string{api.UpgradeTalos}))
}
