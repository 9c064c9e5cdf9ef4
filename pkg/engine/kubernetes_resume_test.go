package engine

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/ichor-dev/kubectl-ichor/pkg/discovery"
	"github.com/ichor-dev/kubectl-ichor/pkg/render"
)

// TestEngineResumesFromAnyPoint stops an upgrade after every possible
// number of progress events, then runs a fresh engine: it must finish, never
// apply a config a node already has, and leave nothing cordoned.
func TestEngineResumesFromAnyPoint(t *testing.T) {
	spec := clusterSpec{controlPlanes: 2, workers: 2, kubernetes: "v1.35.4", workloads: 1}

	ref := newFakeCluster(t, spec)
	all := &recorder{}
	e := ref.engine("v1.36.3", func(o *Options) { o.MaxUnavailable = 2 })
	e.Progress = all
	require.NoError(t, e.Run(context.Background()))

	total := len(all.all())
	require.Greater(t, total, 50)
	wantApplies := len(ref.realApplies())

	for stopAt := 1; stopAt <= total; stopAt++ {
		t.Run(fmt.Sprintf("after %d of %d", stopAt, total), func(t *testing.T) {
			t.Parallel()

			f := newFakeCluster(t, spec)
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()

			rec := &recorder{stopAt: stopAt, cancel: cancel}
			first := f.engine("v1.36.3", func(o *Options) { o.MaxUnavailable = 2 })
			first.Progress = rec

			if err := first.Run(ctx); err != nil {
				require.ErrorIs(t, err, context.Canceled, "a stop is not a pause: %v", err)

				var pause *PauseError
				require.False(t, errors.As(err, &pause))
			}

			require.NoError(t, f.engine("v1.36.3").Run(context.Background()))
			assert.Len(t, f.realApplies(), wantApplies, "no node applied twice")
			requireFinished(t, f, "v1.36.3")
		})
	}
}

// TestEngineSurvivesEvictingItself: the runner's pod runs on the node it
// drains; the eviction stops the engine. The next runner (on another node)
// finishes that node first, without applying anything twice.
func TestEngineSurvivesEvictingItself(t *testing.T) {
	f := newFakeCluster(t, clusterSpec{controlPlanes: 1, workers: 3, kubernetes: "v1.35.4", workloads: 1})

	runnerPod(t, f, "worker-2", "ichor-run-abcde")

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	// The kubelet stops the runner's container: its context ends.
	f.onEvict = func(ns, name string) {
		if ns == "ichor-system" {
			cancel()
		}
	}

	err := f.engine("v1.36.3", func(o *Options) { o.Self = "worker-2" }).Run(ctx)
	require.ErrorIs(t, err, context.Canceled)
	assert.Equal(t, []string{"worker-2"}, f.cordonedByIchor(), "the runner's node stays cordoned by ichor")
	assert.Zero(t, appliesOn(f, "worker-2"))
	assert.Equal(t, 1, appliesOn(f, "worker-3"), "the runner's node went last")

	// The Job's next pod runs on worker-1.
	rec := &recorder{}
	next := f.engine("v1.36.3", func(o *Options) { o.Self = "worker-1" })
	next.Progress = rec

	require.NoError(t, next.Run(context.Background()))
	requireFinished(t, f, "v1.36.3")
	assert.Equal(t, 1, appliesOn(f, "worker-2"))

	kubelets := rec.with("Kubelets ", "Pending")
	require.NotEmpty(t, kubelets)
	assert.Contains(t, rec.with("Kubelets worker-")[0], "worker-2", "the node ichor cordoned is finished first")
}

// A control plane whose hold is removed while the cluster is further on takes the
// stages it missed one apply each, from APIServers: never several stages' worth at
// once. It goes first in the next stage wherever it is in the order: its apiserver
// behind holds back every other controller-manager.
func TestEngineNodeBehindTakesOneStageAtATime(t *testing.T) {
	for name, order := range map[string]map[string]string{
		"first in the order": {"cp-3": "1", "cp-1": "2", "cp-2": "3"},
		"last in the order":  {},
	} {
		t.Run(name, func(t *testing.T) {
			f := newFakeCluster(t, clusterSpec{controlPlanes: 3, kubernetes: "v1.35.4"})
			ctx := context.Background()

			for node, o := range order {
				n, err := f.cs.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
				require.NoError(t, err)

				n.Labels[discovery.OrderLabel] = o
				_, err = f.cs.CoreV1().Nodes().Update(ctx, n, metav1.UpdateOptions{})
				require.NoError(t, err)
			}

			setHold(t, f, "cp-3", "RMA")

			before := render.Images(f.machine("cp-3").active)

			var once sync.Once

			// The hold goes while the APIServers stage, which read cp-3 as held,
			// applies the last of the others.
			f.beforeApply = func(_ context.Context, m *fakeMachine) {
				if m.name == "cp-2" {
					once.Do(func() { setHold(t, f, "cp-3", "") })
				}
			}

			rec := &recorder{}
			e := f.engine("v1.36.3")
			e.Progress = rec

			require.NoError(t, e.Run(ctx))
			assert.NotEmpty(t, rec.with("ControlPlaneComponents cp-3", "behind the cluster: takes stage APIServers first"))

			applies := f.realApplies()
			require.Len(t, applies, 12, "APIServers, ControlPlaneComponents, KubeProxy, Kubelets: one apply each on each")
			assert.Equal(t, 4, appliesOn(f, "cp-3"))
			// applies[0:2] are the APIServers stage's on cp-1 and cp-2.
			assert.Equal(t, "cp-3", applies[2].node, "cp-3 goes first after the APIServers stage")
			assert.Equal(t, []discovery.Component{discovery.APIServer}, changed(before, applies[2].images))
			assert.Equal(t, "cp-3", applies[3].node)
			assert.Equal(t, []discovery.Component{discovery.ControllerManager, discovery.Scheduler}, changed(applies[2].images, applies[3].images))
			assert.Empty(t, f.invariantHistory())
			requireFinished(t, f, "v1.36.3")
		})
	}
}
