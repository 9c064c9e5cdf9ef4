package job

import (
	"context"
	"fmt"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	api "github.com/ichor-dev/kubectl-ichor/pkg/api/v1alpha1"
	"github.com/ichor-dev/kubectl-ichor/pkg/engine"
)

// testPath is a path operation of three hops: Talos, then two Kubernetes minors.
func testPath(id string, phase api.Phase) *api.Operation {
	op := testOperation(id, phase)
	op.Spec.Upgrade, op.Spec.Target = api.UpgradeCluster, "talos v1.14.1, kubernetes v1.35.4"
	op.Spec.Hops = []api.HopSpec{
		{Upgrade: api.UpgradeTalos, To: "v1.14.1", Source: api.SourceTarget},
		{Upgrade: api.UpgradeKubernetes, To: "v1.34.5", Source: api.SourceRegistry},
		{Upgrade: api.UpgradeKubernetes, To: "v1.35.4", Source: api.SourceTarget},
	}

	return op
}

// hopEngine records each engine the runner builds (kind and target) and reports a node
// done in it; fail, when it returns an error for a target, pauses that hop. A PullOnly
// engine is recorded in pulled, and pauses when pullFail returns an error.
type hopEngine struct {
	ran, pulled []string
	fail        func(target string) error
	pullFail    func(target string) error
}

func (h *hopEngine) run(_ context.Context, cfg EngineConfig) error {
	o := cfg.Options

	if o.PullOnly {
		h.pulled = append(h.pulled, fmt.Sprintf("%s %s", o.Kind, o.Target))

		if h.pullFail != nil {
			return h.pullFail(o.Target)
		}

		return nil
	}

	h.ran = append(h.ran, fmt.Sprintf("%s %s", o.Kind, o.Target))

	cfg.Progress.Stage(1, 1, "Stage-"+o.Target)
	cfg.Progress.Node("Stage-"+o.Target, "cp-1", engine.PhaseDone, "at "+o.Target)

	if h.fail != nil {
		return h.fail(o.Target)
	}

	return nil
}

// TestRunnerRunsPathHops: a path's hops run in order, each an engine of its kind and
// version; the state records each hop's start and end, and each hop's nodes are its own.
func TestRunnerRunsPathHops(t *testing.T) {
	op := testPath("path-1", api.PhasePending)
	h := &hopEngine{}
	f := newRunner(t, op, h.run)

	require.NoError(t, f.runner.Run(context.Background()), f.out.String())

	assert.Equal(t, []string{"talos v1.14.1", "kubernetes v1.34.5", "kubernetes v1.35.4"}, h.pulled, "every hop's images first")
	assert.Equal(t, []string{"talos v1.14.1", "kubernetes v1.34.5", "kubernetes v1.35.4"}, h.ran)

	s := f.state(t).Status
	assert.Equal(t, api.PhaseSucceeded, s.Phase)
	assert.Equal(t, 3, s.Hop)
	require.Len(t, s.Hops, 3)

	for i, hop := range s.Hops {
		assert.Equal(t, i+1, hop.Number)
		assert.Equal(t, op.Spec.Hops[i].To, hop.To)
		assert.NotNil(t, hop.Done, "hop %d done", hop.Number)
		assert.Equal(t, 1, hop.Nodes)
	}

	require.Len(t, s.Nodes, 1, "the last hop's nodes only")
	assert.Equal(t, "Stage-v1.35.4", s.Nodes[0].Stage)
	assert.Equal(t, "Stage-v1.35.4", s.Stage)
	assert.Contains(t, f.out.String(), "hop 2/3: kubernetes upgrade to v1.34.5")
	assert.Contains(t, f.out.String(), "hop 3/3 done: every node at kubernetes v1.35.4")
}

// TestRunnerContinuesPathAtItsHop: a runner that takes over a path continues at the hop
// the state is in (a hop started, not done: that hop again), or at the next one when
// that hop is done; it never runs a hop that is done again.
func TestRunnerContinuesPathAtItsHop(t *testing.T) {
	at := metav1.NewMicroTime(t0)

	for _, tt := range []struct {
		name string
		hops []api.HopStatus
		want []string
	}{
		{"in hop 2", []api.HopStatus{
			{Number: 1, Upgrade: api.UpgradeTalos, To: "v1.14.1", Started: at, Done: &at},
			{Number: 2, Upgrade: api.UpgradeKubernetes, To: "v1.34.5", Started: at},
		}, []string{"kubernetes v1.34.5", "kubernetes v1.35.4"}},
		{"hop 2 done", []api.HopStatus{
			{Number: 1, Upgrade: api.UpgradeTalos, To: "v1.14.1", Started: at, Done: &at},
			{Number: 2, Upgrade: api.UpgradeKubernetes, To: "v1.34.5", Started: at, Done: &at},
		}, []string{"kubernetes v1.35.4"}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			op := testPath("path-1", api.PhaseRunning)
			op.Status.Runs = 1
			op.Status.Hop = 2
			op.Status.Hops = tt.hops

			h := &hopEngine{}
			f := newRunner(t, op, h.run)

			require.NoError(t, f.runner.Run(context.Background()), f.out.String())
			assert.Equal(t, tt.want, h.ran)
			assert.Empty(t, h.pulled, "the path's pre-pull comes before its first hop only")

			s := f.state(t).Status
			require.Len(t, s.Hops, 3)
			assert.Equal(t, t0, s.Hops[1].Started.UTC(), "a hop keeps its first start")
		})
	}
}

// TestRunnerPausesBetweenHops: with --pause-between-hops the path pauses after each hop
// but the last, saying which is done and which is next; resumed, it goes on with the
// next hop only.
func TestRunnerPausesBetweenHops(t *testing.T) {
	op := testPath("path-1", api.PhasePending)
	op.Spec.PauseBetweenHops = true

	h := &hopEngine{}
	f := newRunner(t, op, h.run)
	ctx := context.Background()

	err := f.runner.Run(ctx)
	require.Equal(t, ExitPaused, exitCode(err), f.out.String())
	assert.Equal(t, []string{"talos v1.14.1"}, h.ran)

	s := f.state(t).Status
	assert.Equal(t, api.PhasePaused, s.Phase)
	assert.Equal(t, "hop 1/3 (talos v1.14.1) is done; the path pauses between hops (--pause-between-hops), hop 2/3 (kubernetes v1.34.5) is next", s.Reason)
	assert.Contains(t, s.Action, "kubectl ichor resume")
	assert.Equal(t, 1, s.Hop)
	assert.Equal(t, 2, s.NextHop())
	require.Len(t, s.Pauses, 1)
	assert.Equal(t, 1, s.Pauses[0].Hop)

	for n, want := range []string{"kubernetes v1.34.5", "kubernetes v1.35.4"} {
		resumeForTest(t, f)

		err = f.runner.Run(ctx)
		if n == 0 {
			require.Equal(t, ExitPaused, exitCode(err), f.out.String())
		} else {
			require.NoError(t, err, f.out.String())
		}

		assert.Equal(t, want, h.ran[len(h.ran)-1])
	}

	s = f.state(t).Status
	assert.Equal(t, api.PhaseSucceeded, s.Phase)
	assert.Len(t, s.HopsDone(), 3)
	assert.Len(t, h.ran, 3, "no hop ran twice")
}

// TestRunnerPathHopPauses: a hop that pauses pauses the path in that hop; resumed, the
// same hop runs again and the path goes on.
func TestRunnerPathHopPauses(t *testing.T) {
	op := testPath("path-1", api.PhasePending)

	h := &hopEngine{fail: func(target string) error {
		if target == "v1.34.5" {
			return &engine.PauseError{Stage: "Stage-v1.34.5", Node: "cp-1", Reason: "apply refused", Action: "fix it"}
		}

		return nil
	}}
	f := newRunner(t, op, h.run)
	ctx := context.Background()

	err := f.runner.Run(ctx)
	require.Equal(t, ExitPaused, exitCode(err), f.out.String())

	s := f.state(t).Status
	assert.Equal(t, 2, s.Hop)
	assert.Len(t, s.HopsDone(), 1)
	assert.Equal(t, 2, s.Pauses[0].Hop)
	assert.Equal(t, "Stage-v1.34.5", s.Pauses[0].Stage)

	h.fail = nil

	resumeForTest(t, f)
	require.NoError(t, f.runner.Run(ctx), f.out.String())
	assert.Equal(t, []string{"talos v1.14.1", "kubernetes v1.34.5", "kubernetes v1.34.5", "kubernetes v1.35.4"}, h.ran)
	assert.Len(t, f.state(t).Status.HopsDone(), 3)
}

// TestRunnerPathPrePullRefuses: an image of a later hop that does not pull stops the
// path before its first change, naming the hop and the node; resumed, the pre-pull runs
// again, then the hops.
func TestRunnerPathPrePullRefuses(t *testing.T) {
	op := testPath("path-1", api.PhasePending)

	h := &hopEngine{pullFail: func(target string) error {
		if target == "v1.35.4" {
			return &engine.PauseError{Stage: "KubeProxy", Node: "worker-2", Reason: "pre-pull: node \"worker-2\": pull kube-proxy:v1.35.4: not found", Action: "make it pullable"}
		}

		return nil
	}}
	f := newRunner(t, op, h.run)
	ctx := context.Background()

	err := f.runner.Run(ctx)
	require.Equal(t, ExitPaused, exitCode(err), f.out.String())
	assert.Empty(t, h.ran, "no hop started")

	s := f.state(t).Status
	assert.Equal(t, `before the path's first change, hop 3/3 (kubernetes v1.35.4): pre-pull: node "worker-2": pull kube-proxy:v1.35.4: not found; nothing was changed`, s.Reason)
	assert.Equal(t, "make it pullable", s.Action)
	assert.Equal(t, "worker-2", s.PausedNode)
	assert.Empty(t, s.Hops)

	h.pullFail = nil

	resumeForTest(t, f)
	require.NoError(t, f.runner.Run(ctx), f.out.String())
	assert.Len(t, h.pulled, 6, "pulled again on resume")
	assert.Len(t, h.ran, 3)
}

// resumeForTest puts a paused operation back to Pending, as `kubectl ichor resume` does
// before its new Job's runner starts.
func resumeForTest(t *testing.T, f *runnerFixture) {
	t.Helper()

	_, err := (&Store{Client: f.client.CoreV1(), Namespace: "ichor-system"}).Update(context.Background(), func(o *api.Operation) error {
		o.Status.Phase = api.PhasePending

		return nil
	})
	require.NoError(t, err)
}
