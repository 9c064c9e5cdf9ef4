package job

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	api "github.com/ichor-dev/kubectl-ichor/pkg/api/v1alpha1"
	"github.com/ichor-dev/kubectl-ichor/pkg/engine"
)

func TestSetNodeTimeline(t *testing.T) {
	s := api.OperationStatus{Phase: api.PhaseRunning}

	at := func(d time.Duration) *metav1.MicroTime {
		mt := metav1.NewMicroTime(t0.Add(d).UTC())

		return &mt
	}

	SetNode(&s, "APIServers", "cp-1", engine.PhasePending, "to apply", t0)
	SetNode(&s, "APIServers", "cp-1", engine.PhaseApplying, "dry run", t0.Add(1500*time.Microsecond))
	SetNode(&s, "APIServers", "cp-1", engine.PhaseApplying, "applying", t0.Add(time.Second))
	SetNode(&s, "APIServers", "cp-1", engine.PhaseVerifying, "waiting", t0.Add(2*time.Second))
	SetNode(&s, "APIServers", "cp-1", engine.PhaseDone, "done", t0.Add(3*time.Second))
	// A runner that takes over verifies the node again: the first times stay.
	SetNode(&s, "APIServers", "cp-1", engine.PhaseDone, "already applied", t0.Add(time.Minute))
	SetNode(&s, "ControlPlaneComponents", "cp-1", engine.PhaseDone, "already applied", t0.Add(2*time.Minute))

	require.Len(t, s.Nodes, 1)
	assert.Equal(t, []api.NodeStageTimes{
		{Stage: "APIServers", ApplyStarted: at(1500 * time.Microsecond), Done: at(3 * time.Second)},
		{Stage: "ControlPlaneComponents", Done: at(2 * time.Minute)},
	}, s.Nodes[0].Timeline)

	// The times survive the ConfigMap to the microsecond.
	op := testOperation("kubernetes-v1-36-3-abcde", api.PhaseRunning)
	op.Status = s

	got, err := DecodeState(stateObject(t, op))
	require.NoError(t, err)
	assert.True(t, got.Status.Nodes[0].Timeline[0].ApplyStarted.Equal(at(1500*time.Microsecond)))
}

// A Talos upgrade's node has no Applying phase: its apply is the Upgrade
// call, then the reboot (Upgrading). Without it in the timeline, the summary
// said every upgraded node was only verified.
func TestSetNodeTimelineOfATalosUpgrade(t *testing.T) {
	var s api.OperationStatus

	SetNode(&s, "TalosOS", "worker-1", engine.PhaseCordoned, "cordoned", t0)
	SetNode(&s, "TalosOS", "worker-1", engine.PhaseDraining, "draining", t0.Add(time.Second))
	SetNode(&s, "TalosOS", "worker-1", engine.PhaseUpgrading, "installing", t0.Add(2*time.Second))
	SetNode(&s, "TalosOS", "worker-1", engine.PhaseUpgrading, "rebooting", t0.Add(3*time.Second))
	SetNode(&s, "TalosOS", "worker-1", engine.PhaseVerifying, "waiting for Ready", t0.Add(7*time.Second))
	SetNode(&s, "TalosOS", "worker-1", engine.PhaseDone, "done", t0.Add(8*time.Second))

	require.Len(t, s.Nodes, 1)
	require.Len(t, s.Nodes[0].Timeline, 1)
	tl := s.Nodes[0].Timeline[0]
	require.NotNil(t, tl.ApplyStarted)
	assert.Equal(t, t0.Add(2*time.Second), tl.ApplyStarted.Time, "the Upgrade call's start")
	assert.Equal(t, t0.Add(8*time.Second), tl.Done.Time)
}

func TestStepRecords(t *testing.T) {
	var s api.OperationStatus

	SetStep(&s, "KubeProxy", engine.StepManifests, engine.StepTiming{Done: true}, t0)
	SetStep(&s, "KubeProxy", engine.StepManifests, engine.StepTiming{Done: true}, t0.Add(2*time.Second))
	SetStep(&s, "KubeProxy", engine.StepRollout, engine.StepTiming{Pods: 5, Updated: 1, MaxUnavailable: 1}, t0.Add(3*time.Second))
	SetStep(&s, "KubeProxy", engine.StepRollout, engine.StepTiming{}, t0.Add(4*time.Second))
	SetStep(&s, "KubeProxy", engine.StepRollout, engine.StepTiming{Done: true, Pods: 5, Updated: 5, MaxUnavailable: 1}, t0.Add(9*time.Second))

	require.Len(t, s.Steps, 2, "one record per stage and step")

	m := s.StepOf("KubeProxy", engine.StepManifests)
	require.NotNil(t, m)
	assert.Equal(t, t0, m.Started.Time, "the first start")
	assert.Equal(t, t0.Add(2*time.Second), m.Done.Time, "the last done: once per control plane")

	r := s.StepOf("KubeProxy", engine.StepRollout)
	require.NotNil(t, r)
	assert.Equal(t, t0.Add(3*time.Second), r.Started.Time)
	assert.Equal(t, 5, r.Updated)
	assert.Equal(t, t0.Add(9*time.Second), r.Observed.Time)
	assert.Nil(t, s.StepOf("Kubelets", engine.StepRollout))
}
