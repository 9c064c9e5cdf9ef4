package engine

import (
	"context"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	k8stesting "k8s.io/client-go/testing"

	"github.com/ichor-dev/kubectl-ichor/pkg/discovery"
	"github.com/ichor-dev/kubectl-ichor/pkg/render"
)

func TestEngineHeldControlPlaneKeepsItsPlace(t *testing.T) {
	f := newFakeCluster(t, clusterSpec{controlPlanes: 3, kubernetes: "v1.35.4"})

	n, err := f.cs.CoreV1().Nodes().Get(context.Background(), "cp-3", metav1.GetOptions{})
	require.NoError(t, err)

	n.Annotations[discovery.HoldAnnotation] = "RMA"
	_, err = f.cs.CoreV1().Nodes().Update(context.Background(), n, metav1.UpdateOptions{})
	require.NoError(t, err)

	rec := &recorder{}
	e := f.engine("v1.36.3")
	e.Progress = rec

	err = e.Run(context.Background())

	// Its apiserver stays behind, so no controller-manager may move past it:
	// refused before the apply, not found broken after.
	requirePause(t, err, "ControlPlaneComponents", "cp-1",
		"would break the invariant", "kube-controller-manager v1.36.3 on cp-1", "kube-apiserver v1.35.4 on cp-3")
	assert.NotEmpty(t, rec.with("APIServers cp-3 Held: held (ichor.dev/hold: RMA)"))
	assert.Equal(t, 1, appliesOn(f, "cp-1"))
	assert.Zero(t, appliesOn(f, "cp-3"))
	assert.Empty(t, f.invariantHistory())

	// The pause says to remove the hold and resume, and that is what runs: the
	// resumed run walks the stages from APIServers, cp-3's first apply moves only
	// its apiserver, then the stages one apply each.
	setHold(t, f, "cp-3", "")

	applied := len(f.realApplies())
	before := render.Images(f.machine("cp-3").active)

	require.NoError(t, f.engine("v1.36.3").Run(context.Background()))
	assert.Equal(t, "cp-3", f.realApplies()[applied].node)
	assert.Equal(t, []discovery.Component{discovery.APIServer}, changed(before, f.realApplies()[applied].images))
	assert.Equal(t, 4, appliesOn(f, "cp-3"), "APIServers, ControlPlaneComponents, KubeProxy, Kubelets: one apply each")
	assert.Empty(t, f.invariantHistory())
	requireFinished(t, f, "v1.36.3")
}

// setHold sets (reason not empty) or removes the hold on node.
func setHold(t *testing.T, f *fakeCluster, node, reason string) {
	t.Helper()

	n, err := f.cs.CoreV1().Nodes().Get(context.Background(), node, metav1.GetOptions{})
	require.NoError(t, err)

	if reason == "" {
		delete(n.Annotations, discovery.HoldAnnotation)
	} else {
		n.Annotations[discovery.HoldAnnotation] = reason
	}

	_, err = f.cs.CoreV1().Nodes().Update(context.Background(), n, metav1.UpdateOptions{})
	require.NoError(t, err)
}

// changed returns the components whose image differs from before in after.
func changed(before, after map[render.Component]string) []discovery.Component {
	var out []discovery.Component

	for _, c := range discovery.Components() {
		if image, ok := after[c]; ok && before[c] != image {
			out = append(out, c)
		}
	}

	return out
}

// A node whose hold is removed while the Kubelets stage runs (after the stage read
// it as held) is taken by the same run: a run that says it succeeded leaves no node
// behind that it may upgrade.
func TestEngineHoldRemovedDuringKubelets(t *testing.T) {
	f := newFakeCluster(t, clusterSpec{controlPlanes: 1, workers: 2, kubernetes: "v1.35.4"})
	setHold(t, f, "worker-1", "disk")

	var once sync.Once

	f.beforeApply = func(_ context.Context, m *fakeMachine) {
		if m.name == "worker-2" {
			once.Do(func() { setHold(t, f, "worker-1", "") })
		}
	}

	rec := &recorder{}
	e := f.engine("v1.36.3")
	e.Progress = rec

	require.NoError(t, e.Run(context.Background()))
	assert.NotEmpty(t, rec.with("Kubelets worker-1 Held: held (ichor.dev/hold: disk)"))
	assert.NotEmpty(t, rec.with("Kubelets [released] hold removed during the stage: worker-1, taken now"))
	assert.Equal(t, 1, appliesOn(f, "worker-1"))
	assert.Empty(t, f.invariantHistory())
	requireFinished(t, f, "v1.36.3")
}

// TestEngineReleasedReadsTheCache: after the Kubelets stage, a node still held is read
// from the run's watch cache, not fetched from the apiserver; its hold kept, it is
// left alone.
func TestEngineReleasedReadsTheCache(t *testing.T) {
	f := newFakeCluster(t, clusterSpec{controlPlanes: 1, workers: 2, kubernetes: "v1.35.4"})
	setHold(t, f, "worker-1", "disk")
	f.cs.ClearActions()

	require.NoError(t, f.engine("v1.36.3").Run(context.Background()))

	for _, a := range f.cs.Actions() {
		if get, ok := a.(k8stesting.GetAction); ok && a.GetResource().Resource == "nodes" {
			assert.NotEqual(t, "worker-1", get.GetName(), "the held Node is read from the cache")
		}
	}

	assert.Zero(t, appliesOn(f, "worker-1"))
}
